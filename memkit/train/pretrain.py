"""A pretrained tiny base, shared by every memory format's SFT (``memkit pretrain``).

The papers' policies arrive pretrained; the tiny model does not, and a from-scratch SFT spends
most of its budget learning to read and copy fictional names. This trains that skill once, as a
causal language model on packed fixed-length sequences of two kinds of plain text (no memory
format's tags: the format is what SFT teaches later):

* the passages of *another* synthetic world (seed ``world_seed + TEXT_WORLD_OFFSET``): the same
  style and vocabulary, other names and facts, so the base learns how pages read without
  memorising a fact a question will ask (the task world's answers must come through retrieval);
* copy/extract text built from that world's names and values, with the values drawn at random so
  that copying from the context is the only way to predict them: pages followed by a question
  and the span copied out of them (``extract``), ``name: value`` lists followed by a lookup
  (``lookup``), and ``Repeat: X`` ... ``X`` (``repeat``).

Documents end with ``<eos>`` and are packed back to back into ``[B, T]`` rows; the loss is the
mean next-token negative log-likelihood over every position:

    L(θ) = − (1 / (B (T − 1))) Σ_b Σ_{t=1}^{T−1} log π_θ(x_{b,t} | x_{b,<t})

Batch ``s`` is a pure function of ``(seed, s)``, so the data position is the step; a run saves
model, optimizer, step, elapsed time and torch RNG every ``checkpoint_every_seconds`` (and on a
first Ctrl-C), and continues from there when started again: the same losses and weights as an
uninterrupted run (on a fixed attention kernel and a step budget; a wall-clock budget depends on
the machine's pace). The cache location and the SFT hook are in :mod:`memkit.lab.policies`.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from memkit.core.cpu import all_cores
from memkit.core.io import atomic_dir
from memkit.models import build_tiny
from memkit.train.config import PretrainConfig
from memkit.train.sft import AttentionProbe, lr_shape, save_checkpoint, sft_uses_bf16
from memkit.world.generator import make_world
from memkit.world.vocab import ATTR_BY_NAME, ATTRS, SUBJECT

COPY_KINDS = ("extract", "lookup", "repeat")
#: the base reads world ``world_seed + TEXT_WORLD_OFFSET``, never the task world itself
TEXT_WORLD_OFFSET = 1000


#: Fields that change how a run is watched, not the base it trains (left out of its cache key).
RUN_ONLY_FIELDS = ("log_every", "checkpoint_every_seconds", "cpu_attention")


def cache_key(cfg: PretrainConfig) -> dict:
    """The fields of ``cfg`` that name the trained base (all but :data:`RUN_ONLY_FIELDS`), and the
    world it reads."""
    return {
        **{k: v for k, v in asdict(cfg).items() if k not in RUN_ONLY_FIELDS},
        "text_world_offset": TEXT_WORLD_OFFSET,
    }


# ---- the text ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class CopyExample:
    """One copy/extract document: ``context + query + answer``; ``answer`` (after its leading
    space) occurs verbatim in ``context``."""

    kind: str  # one of COPY_KINDS
    context: str
    query: str
    answer: str

    @property
    def text(self) -> str:
        return self.context + self.query + self.answer


def value_pools(world) -> dict[str, list[str]]:
    """Every attribute's values in the world (sorted, distinct): what random facts are drawn from."""
    pools: dict[str, set[str]] = {a.name: set() for a in ATTRS}
    for e in world.entities:
        for name, value in e.attributes.items():
            pools[name].add(value)
    return {name: sorted(values) for name, values in pools.items()}


def synthetic_page(entity, rng: random.Random, pools) -> tuple[str, dict[str, str]]:
    """A page in the world's style about ``entity`` stating 2+ random facts: ``(text, facts)``."""
    attrs = [a for a in ATTRS if a.etype == entity.type]
    chosen = rng.sample(attrs, rng.randint(2, len(attrs)))
    facts = {a.name: rng.choice(pools[a.name]) for a in chosen}
    sentences = [rng.choice(a.sentences).format(n=entity.name, v=facts[a.name]) for a in chosen]
    return f"{entity.name}\n" + " ".join(sentences), facts


def extract_example(world, rng: random.Random, pools) -> CopyExample:
    """1-3 random pages, then a question about one of them and the value copied from it."""
    ents = rng.sample(world.entities, rng.randint(1, 3))
    pages = [synthetic_page(e, rng, pools) for e in ents]
    i = rng.randrange(len(ents))
    attr = ATTR_BY_NAME[rng.choice(sorted(pages[i][1]))]
    question = attr.question.format(s=SUBJECT.get(ents[i].type, "{n}").format(n=ents[i].name))
    return CopyExample(
        "extract",
        "\n\n".join(text for text, _ in pages),
        f"\nQuestion: {question}\nAnswer:",
        f" {pages[i][1][attr.name]}",
    )


def lookup_example(world, rng: random.Random, pools) -> CopyExample:
    """A list of 3-10 ``name: value`` pairs of one attribute, then one name looked up."""
    attr = rng.choice(ATTRS)
    ents = rng.sample(world.of_type(attr.etype), rng.randint(3, 10))
    values = [rng.choice(pools[attr.name]) for _ in ents]
    lines = [f"{e.name}: {v}" for e, v in zip(ents, values)]
    i = rng.randrange(len(ents))
    return CopyExample(
        "lookup",
        attr.name.replace("_", " ") + ":\n" + "\n".join(lines),
        f"\nLookup: {ents[i].name}\nValue:",
        f" {values[i]}",
    )


def repeat_example(world, rng: random.Random, pools) -> CopyExample:
    """``Repeat: X`` then ``X`` again, X a comma list of 1-6 names and values."""
    items = [
        rng.choice(world.entities).name if rng.random() < 0.5 else rng.choice(pools[rng.choice(ATTRS).name])
        for _ in range(rng.randint(1, 6))
    ]
    span = ", ".join(items)
    return CopyExample("repeat", f"Repeat: {span}", "\nAgain:", f" {span}")


BUILDERS = {"extract": extract_example, "lookup": lookup_example, "repeat": repeat_example}


def copy_example(world, rng: random.Random, pools, kind: str | None = None) -> CopyExample:
    """One copy/extract document of ``kind`` (None: drawn uniformly from :data:`COPY_KINDS`)."""
    return BUILDERS[kind or rng.choice(COPY_KINDS)](world, rng, pools)


def text_world(world_seed: int):
    """The world whose text the base of task world ``world_seed`` is pretrained on."""
    return make_world(seed=world_seed + TEXT_WORLD_OFFSET)


def heldout_sample(world, n: int) -> list:
    """``n`` of the task world's passages (drawn by its seed) for the held-out perplexity."""
    rng = random.Random(f"pretrain-heldout-{world.seed}")
    return [world.passages[i] for i in sorted(rng.sample(range(len(world.passages)), min(n, len(world.passages))))]


def passage_text(passage) -> str:
    return f"{passage.title}\n{passage.text}"  # as memkit.world.world_texts writes pages


def document(world, rng: random.Random, pools, passages, copy_fraction: float) -> str:
    """One training document: copy/extract text with probability ``copy_fraction``, else a passage."""
    if rng.random() < copy_fraction:
        return copy_example(world, rng, pools).text
    return passage_text(rng.choice(passages))


def batch_ids(world, tokenizer, cfg: PretrainConfig, step: int, pools, passages) -> torch.Tensor:
    """Batch ``step`` of the stream, ``[B, T]``: documents + ``<eos>`` packed back to back.

    A pure function of ``(cfg.seed, step)``: a resumed run reads exactly the batches it missed."""
    rng = random.Random(f"pretrain-{cfg.seed}-{step}")
    need, ids = cfg.batch_size * cfg.seq_len, []
    while len(ids) < need:
        texts = [document(world, rng, pools, passages, cfg.copy_fraction) for _ in range(16)]
        for row in tokenizer(texts, add_special_tokens=False)["input_ids"]:
            ids += row + [tokenizer.eos_token_id]
    return torch.tensor(ids[:need]).view(cfg.batch_size, cfg.seq_len)


# ---- loss and evaluation ------------------------------------------------------------------------
def lm_loss(model, ids: torch.Tensor) -> torch.Tensor:
    """The module doc's L(θ): mean next-token NLL over ``ids`` ``[B, T]`` (no padding)."""
    logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()  # [B, T-1, V]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


@torch.no_grad()
def heldout_perplexity(model, tokenizer, passages) -> float | None:
    """exp(mean next-token NLL) over the held-out passages, each its own sequence (+ ``<eos>``)."""
    nll, n = 0.0, 0
    device = next(model.parameters()).device
    for p in passages:
        row = tokenizer(passage_text(p), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids = torch.tensor([row], device=device)
        nll += lm_loss(model, ids).item() * (ids.shape[1] - 1)
        n += ids.shape[1] - 1
    return math.exp(nll / n) if n else None


@torch.no_grad()
def copy_accuracy(model, tokenizer, world, n: int = 60) -> dict[str, float]:
    """Share of fresh copy/extract examples (``n`` per kind, a fixed eval stream) whose every
    answer token is the model's greedy choice given the prompt and the answer so far."""
    rng, pools, out = random.Random(f"pretrain-eval-{world.seed}"), value_pools(world), {}
    device = next(model.parameters()).device
    for kind in COPY_KINDS:
        right = 0
        for _ in range(n):
            ex = copy_example(world, rng, pools, kind)
            prompt = tokenizer(ex.context + ex.query, add_special_tokens=False)["input_ids"]
            ids = tokenizer(ex.text, add_special_tokens=False)["input_ids"]
            if ids[: len(prompt)] != prompt:
                raise ValueError(f"the tokenizer splits {ex.text!r} across its prompt/answer boundary")
            logits = model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0]
            right += bool((logits[len(prompt) - 1 : -1].argmax(-1).cpu() == torch.tensor(ids[len(prompt) :])).all())
        out[kind] = right / n
    return out


# ---- the run -----------------------------------------------------------------------------------
@dataclass
class BaseRun:
    path: Path  # the finished base (a save_pretrained dir) once ``finished``
    finished: bool  # False when stopped early (``stop_after``): run again to continue
    history: list[dict]  # one row per logged step, all sessions
    metrics: dict  # finished only: final_loss, heldout_ppl, copy_accuracy, steps, seconds


def partial_path(path: Path) -> Path:
    """Where an unfinished run of the base at ``path`` keeps its resumable state."""
    return Path(path).with_name(Path(path).name + ".partial")


@contextmanager
def _first_ctrl_c_finishes_the_step():
    """A first Ctrl-C sets a flag (the loop saves and stops at the step's end); a second one stops at once."""
    hits: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield hits
        return

    def handler(signum, frame):
        if hits:
            raise KeyboardInterrupt
        hits.append(signum)

    old = signal.signal(signal.SIGINT, handler)
    try:
        yield hits
    finally:
        signal.signal(signal.SIGINT, old)


def _save_state(partial: Path, model, opt, cfg, step: int, seconds: float, history: list[dict], losses) -> None:
    """Everything a continued run needs: weights, AdamW moments, the step (= the data position, see
    :func:`batch_ids`), the time spent, the log so far (and the losses not yet logged), torch's RNG."""
    with atomic_dir(partial) as tmp:
        torch.save(
            {
                "model": model.state_dict(),
                "optimizer": opt.state_dict(),
                "step": step,
                "seconds": seconds,
                "history": history,
                "losses": losses,
                "torch_rng": torch.get_rng_state(),
                "config": cache_key(cfg),
            },
            tmp / "state.pt",
        )


def train_base(
    kit, cfg: PretrainConfig, path: Path, progress: bool = True, log=None, stop_after: int | None = None
) -> BaseRun:
    """Pretrain the tiny base on ``kit`` (``.world``, ``.tokenizer``, ``.world_seed``) into ``path``.

    A finished base at ``path`` is returned as is; an unfinished run there (:func:`partial_path`)
    continues. ``stop_after``: train at most this many steps in this call, save, and return
    unfinished. ``log`` is called with every logged row."""
    path = Path(path)
    if (path / "memkit.json").is_file():
        meta = json.loads((path / "memkit.json").read_text())
        return BaseRun(path, True, meta["history"], meta["metrics"])
    if cfg.world_seed != kit.world_seed:
        raise ValueError(f"PretrainConfig.world_seed={cfg.world_seed} but the kit is world {kit.world_seed}")
    tok, world = kit.tokenizer, text_world(kit.world_seed)
    model = build_tiny(tok, seed=cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.95))
    start, seconds, history, losses, partial = 0, 0.0, [], [], partial_path(path)
    if (partial / "state.pt").is_file():
        state = torch.load(partial / "state.pt", weights_only=True)
        if state["config"] != cache_key(cfg):
            raise ValueError(f"{partial} holds a run of another config; delete it or train into another path")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        start, seconds, history, losses = state["step"], state["seconds"], state["history"], state["losses"]
    pools, passages, heldout = value_pools(world), world.passages, heldout_sample(kit.world, cfg.heldout_passages)
    shape, device = lr_shape(cfg), next(model.parameters()).device
    attn_impl = model.config._attn_implementation
    probe = AttentionProbe() if device.type == "cpu" and cfg.cpu_attention == "auto" else None
    if device.type == "cpu":
        model.set_attn_implementation("eager" if probe else cfg.cpu_attention)
    bf16 = sft_uses_bf16(cfg.bf16, device)
    t0 = time.perf_counter() - seconds  # the budget counts earlier sessions too
    last_save, step, done = time.perf_counter(), start, start >= cfg.steps
    model.train()
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.steps, initial=start, desc="pretrain", leave=False)
    try:
        with all_cores() as threads, _first_ctrl_c_finishes_the_step() as interrupted:
            while not done:
                ids = batch_ids(world, tok, cfg, step, pools, passages).to(device)
                kernel = probe.before_step(model, step - start) if probe else None
                elapsed = time.perf_counter() - t0
                frac = min(1.0, max(step / cfg.steps, elapsed / cfg.max_seconds if cfg.max_seconds else 0.0))
                for group in opt.param_groups:
                    group["lr"] = cfg.lr * min(1.0, (step + 1) / cfg.warmup) * shape(frac)
                t_step = time.perf_counter()
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                    loss = lm_loss(model, ids)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                if kernel:
                    probe.record(kernel, time.perf_counter() - t_step, ids.numel())
                losses.append(loss.item())
                step += 1
                seconds = time.perf_counter() - t0
                done = step >= cfg.steps or bool(cfg.max_seconds) and seconds >= cfg.max_seconds
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
                if (step - 1) % cfg.log_every == 0 or done:
                    row = {
                        "step": step - 1,
                        "loss": sum(losses) / len(losses),
                        "lr": opt.param_groups[0]["lr"],
                        "seconds": seconds,
                        "tokens": step * ids.numel(),
                        "attention": model.config._attn_implementation,
                    }
                    history.append(row)
                    losses = []
                    if log:
                        log(row)
                stop = not done and (interrupted or (stop_after is not None and step - start >= stop_after))
                if stop or (not done and time.perf_counter() - last_save >= cfg.checkpoint_every_seconds):
                    _save_state(partial, model, opt, cfg, step, seconds, history, losses)
                    last_save = time.perf_counter()
                if stop and interrupted:
                    raise KeyboardInterrupt(f"pretraining stopped after step {step - 1}")
                if stop:
                    return BaseRun(path, False, history, {})
    finally:
        if bar is not None:
            bar.close()
        model.set_attn_implementation(attn_impl)
        model.eval()
    metrics = {
        "final_loss": history[-1]["loss"] if history else None,
        "steps": step,
        "seconds": seconds,
        "heldout_ppl": heldout_perplexity(model, tok, heldout),
        "heldout_passages": [p.id for p in heldout],
        "copy_accuracy": copy_accuracy(model, tok, kit.world),
        "torch_threads": threads,
    }
    save_checkpoint(model, tok, path, {"pretrain": asdict(cfg), "history": history, "metrics": metrics})
    shutil.rmtree(partial, ignore_errors=True)
    return BaseRun(path, True, history, metrics)
