"""The pretrained tiny base: its text, that it learns, exact resume, SFT starting from it, the CLI."""

import random
from contextlib import nullcontext
from dataclasses import asdict, replace

import pytest
import torch

from memkit.models import TAGS, load_policy
from memkit.train import pretrain
from memkit.train.pretrain import (
    COPY_KINDS,
    PretrainConfig,
    batch_ids,
    copy_example,
    heldout_sample,
    partial_path,
    text_world,
    train_base,
    value_pools,
)
from memkit.train.sft import SFTConfig

#: A few-second run: short rows, a fixed kernel (exact resume), no wall-clock budget.
TINY = PretrainConfig(
    seq_len=48,
    batch_size=4,
    steps=8,
    warmup=2,
    max_seconds=None,
    heldout_passages=4,
    cpu_attention="eager",
    log_every=1,
)


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    """Train these tiny batches on one thread: a second adds only OpenMP spin-waits, which cost
    ~20x on a CPU shared with other jobs (memkit.core.cpu). ``all_cores`` itself is tested in test_sft."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setattr(pretrain, "all_cores", lambda: nullcontext(1))
    yield
    torch.set_num_threads(before)


def _weights(path):
    return load_policy(str(path)).model.state_dict()


def test_copy_examples_copy_a_span_that_occurs_in_their_context_and_carry_no_format_tags(kit):
    pools, rng = value_pools(kit.world), random.Random(0)
    seen = set()
    for _ in range(600):
        ex = copy_example(kit.world, rng, pools)
        seen.add(ex.kind)
        assert ex.answer.startswith(" ") and ex.answer[1:] in ex.context, ex
        assert ex.text == ex.context + ex.query + ex.answer
        assert not any(tag in ex.text for tag in TAGS), ex.text
        if ex.kind == "lookup":  # the looked-up name's own line holds the answer
            name = ex.query.split("Lookup: ")[1].split("\n")[0]
            assert f"\n{name}:{ex.answer}" in "\n" + ex.context.split(":\n", 1)[1]
    assert seen == set(COPY_KINDS)
    ex = copy_example(kit.world, random.Random(1), pools, "extract")
    assert ex.query.startswith("\nQuestion: ") and ex.query.endswith("\nAnswer:")


def test_the_stream_is_a_pure_function_of_the_step_and_reads_another_world(kit):
    """The base reads world seed + TEXT_WORLD_OFFSET: none of the task world's names or pages."""
    other = text_world(kit.world_seed)
    assert not {e.name for e in other.entities} & {e.name for e in kit.world.entities}
    pools = value_pools(other)
    cfg = replace(TINY, copy_fraction=0.0, seq_len=256, batch_size=8)
    a = batch_ids(other, kit.tokenizer, cfg, 3, pools, other.passages)
    assert a.shape == (8, 256) and torch.equal(a, batch_ids(other, kit.tokenizer, cfg, 3, pools, other.passages))
    assert not torch.equal(a, batch_ids(other, kit.tokenizer, cfg, 4, pools, other.passages))
    text = kit.tokenizer.decode(a.flatten().tolist())
    assert kit.tokenizer.eos_token in text
    assert any(p.text[:60] in text for p in other.passages) and not any(p.text[:60] in text for p in kit.world.passages)
    held = heldout_sample(kit.world, 6)
    assert len(held) == 6 and held == heldout_sample(kit.world, 6) and all(p in kit.world.passages for p in held)


def test_pretraining_lowers_the_loss(kit, tmp_path):
    cfg = replace(TINY, steps=40, warmup=5, lr=4e-3, seq_len=64, log_every=5)
    run = train_base(kit, cfg, tmp_path / "base", progress=False)
    assert run.finished and (run.path / "memkit.json").is_file() and not partial_path(run.path).exists()
    losses = [r["loss"] for r in run.history]
    assert losses[-1] < losses[0] - 1.0, losses
    m = run.metrics
    assert m["steps"] == 40 and m["heldout_ppl"] > 1 and set(m["copy_accuracy"]) == set(COPY_KINDS)
    again = train_base(kit, cfg, tmp_path / "base", progress=False)  # a finished base is reused
    assert again.finished and again.history == run.history


def test_an_interrupted_run_continues_exactly_where_it_stopped(kit, tmp_path):
    cfg = replace(TINY, log_every=3)  # the stop falls between two log rows: the pending losses carry over
    whole = train_base(kit, cfg, tmp_path / "whole", progress=False)
    first = train_base(kit, cfg, tmp_path / "split", progress=False, stop_after=4)
    assert not first.finished and (partial_path(tmp_path / "split") / "state.pt").is_file()
    assert not (tmp_path / "split").exists() and [r["step"] for r in first.history] == [0, 3]
    rest = train_base(kit, cfg, tmp_path / "split", progress=False)
    assert rest.finished and not partial_path(tmp_path / "split").exists()
    assert [r["step"] for r in rest.history] == [r["step"] for r in whole.history] == [0, 3, 6, 7]
    for a, b in zip(whole.history, rest.history):
        assert abs(a["loss"] - b["loss"]) < 1e-6 and a["lr"] == b["lr"]
    wa, wb = _weights(whole.path), _weights(rest.path)
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6, rtol=0) for k in wa)
    with pytest.raises(ValueError, match="another config"):  # a partial run of another config is never mixed in
        train_base(kit, cfg, tmp_path / "other", progress=False, stop_after=1)
        train_base(kit, replace(cfg, lr=1e-3), tmp_path / "other", progress=False)


def test_sft_from_the_base_starts_from_its_weights(kit, tmp_path, monkeypatch):
    from memkit.lab import policies, runs as training

    monkeypatch.setenv("MEMKIT_CACHE", str(tmp_path))  # the default base's path, filled by a tiny run
    train_base(kit, TINY, policies.base_checkpoint_path(), progress=False)
    base = _weights(policies.base_checkpoint_path())
    started = policies.sft_init(SFTConfig(init="base"), kit).model.state_dict()
    assert all(torch.equal(base[k], started[k]) for k in base)
    scratch = policies.sft_init(SFTConfig(), kit).model.state_dict()
    assert not torch.equal(scratch["model.embed_tokens.weight"], base["model.embed_tokens.weight"])

    seen = {}

    def fake_train_sft(model, tokenizer, examples, cfg, log=None, progress=True):
        seen.update({k: v.clone() for k, v in model.state_dict().items()})
        return []

    monkeypatch.setattr(training, "train_sft", fake_train_sft)
    cfg = SFTConfig(method="mem1", init="base", n_tasks=2, steps=1, max_seconds=None)
    path, _, _ = training.train_sft_model("mem1", kit, cfg, progress=False, path=tmp_path / "sft")
    assert all(torch.equal(base[k], seen[k]) for k in base)
    cont = policies.sft_init(SFTConfig(method="mem1", init=str(path)), kit).model.state_dict()
    assert all(torch.equal(base[k], cont[k]) for k in base)  # continuing a checkpoint loads it as saved


def test_sft_tags_and_cache_keys_differ_per_init(tmp_path, monkeypatch):
    from memkit.lab.policies import config_hash, sft_cache_key, sft_tag

    d = SFTConfig()
    assert sft_tag(d) == "default" and sft_tag(replace(d, init="base")) == "default-base"
    assert sft_tag(replace(d, objectives=(1, 2, 3), init="base")) == "k1-2-3-n4000-s0-base"
    cont = sft_tag(replace(d, init="tiny-sft:flaw-fe"))
    assert cont.startswith("default-cont") and cont != sft_tag(replace(d, init="tiny-sft:other"))
    (tmp_path / "ckpt").mkdir()
    monkeypatch.chdir(tmp_path)  # a directory is named by its absolute path
    assert sft_tag(replace(d, init="ckpt")) == sft_tag(replace(d, init=str(tmp_path / "ckpt")))
    keys = {sft_cache_key(replace(d, init=i)) for i in ("scratch", "base", "tiny-sft:flaw-fe")}
    assert len(keys) == 3
    legacy = {
        k: v
        for k, v in asdict(d).items()
        if k not in ("init", "method_kwargs", "lora", "gradient_checkpointing", "data")
    }
    legacy.update(  # the tiny's values, before they became model-dependent; world_seed before the data group
        lr=4e-3, max_len=768, warmup=200, context_weight=1.0, k_docs=1, world_seed=0
    )
    assert sft_cache_key(d) == config_hash(
        legacy
    )  # caches made before `init`, `method_kwargs`, `lora`, `data` keep their names
    assert sft_cache_key(replace(d, lora=replace(d.lora, enabled=True))) != sft_cache_key(d)
    assert sft_cache_key(replace(d, method="memact", method_kwargs={"schedule": "window"})) != sft_cache_key(
        replace(d, method="memact")
    )


def test_base_path_names_the_config_but_not_how_it_is_watched(monkeypatch, tmp_path):
    from memkit.lab.policies import base_checkpoint_path

    monkeypatch.setenv("MEMKIT_CACHE", str(tmp_path))
    p = base_checkpoint_path()
    assert p.parent == tmp_path and p.name.startswith("tiny-base-w0-")
    assert base_checkpoint_path(PretrainConfig(log_every=7, checkpoint_every_seconds=5)) == p
    assert base_checkpoint_path(PretrainConfig(max_seconds=60)) != p
    assert base_checkpoint_path(PretrainConfig(copy_fraction=0.5)) != p


def test_sft_init_refuses_other_tokenizers_and_nonsense(kit):
    from memkit.lab.policies import sft_init

    with pytest.raises(ValueError, match="scratch"):
        sft_init(SFTConfig(init="tiny"), kit)
    with pytest.raises(FileNotFoundError, match="memkit sft"):
        sft_init(SFTConfig(init="tiny-sft:no-such-tag"), kit)


def test_cli_pretrain_help_and_a_short_run(capsys):
    from memkit.cli import build_parser, main
    from memkit.cli.args import config_from_args

    with pytest.raises(SystemExit) as e:
        main(["pretrain", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "--max-minutes" in out and "--copy-fraction" in out and "--heldout-passages" in out
    sft = config_from_args(SFTConfig, build_parser().parse_args(["sft", "--method", "mem1", "--init", "base"]))
    assert sft.init == "base"
    argv = [
        "pretrain",
        "--steps",
        "3",
        "--seq-len",
        "32",
        "--batch-size",
        "2",
        "--max-minutes",
        "0",
        "--heldout-passages",
        "2",
        "--log-every",
        "1",
        "--cpu-attention",
        "eager",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "step      2" in out and "base: " in out and "held-out perplexity" in out and "--init " in out
    assert main(argv) == 0 and "reusing the finished base" in capsys.readouterr().out
