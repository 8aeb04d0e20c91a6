"""Where one GRPO step's time goes, and whether packing pays once attention skips masked cells.

    python benchmarks/grpo_step.py [--tasks 8] [--n 4] [--objectives 8] [--n-trajs 2] [--device cpu|cuda]

Part 1, one MEM1 GRPO step of the tiny model with the trainer's defaults (mem1_mask rows,
recomputed old log-probs, KL to a reference): rollout generation of ``--tasks`` x ``--n``
trajectories at T = 1, then ``Learner.update`` on exactly those trajectories once per attention
path (``TrainConfig.runtime.attention``), split into packing + credit, the old and reference log-prob
forwards, and the update's forward and its backward + optimizer step (best of ``--repeats``).
The policy is ``memkit sft --method mem1``'s checkpoint when cached; else a fresh model, whose
one-call garbage trajectories would leave nothing to pack, so its update runs on oracle
trajectories of the same tasks.

Part 2, the packed vs separate forward + backward at k = ``--objectives``: ``--n-trajs`` MEM1
oracle trajectories (valid, multi-turn, no model needed) packed as ``separate``, ``mem1_mask`` and
``mem1_exact`` rows, ``--micro`` trajectories per forward, on a fresh tiny model. Per path it
prints the wall ratio packed / separate (the issue's target: <= 0.8x), the attention scores
computed per head and layer (dense: B L^2; blocks: the gathered blocks) and max |dlogp| on the
trained tokens against the dense path (target <= 1e-4) and, for mem1_exact, against separate.
``flex`` runs on CUDA only (no CPU backward); its compile is timed apart ("first call").
``TrainConfig.runtime.attention = "auto"`` takes the path these numbers favour on each device.

All numbers come from one process on the same trajectories. (measured: docs/findings.md, 'Benchmarks')
"""

from __future__ import annotations

import argparse
import time

import torch

from memkit.core.cpu import keep_freed_memory
from memkit.lab.evaluation import rollout
from memkit.lab.kit import load_kit
from memkit.lab.policies import fresh_tiny, load_init, prompt_wrap, sft_checkpoint_path
from memkit.rl.block_attention import block_plan, flex_available, flex_block_mask
from memkit.rl.config import TrainConfig
from memkit.rl.engines import make_accelerator
from memkit.rl.packed_forward import packed_token_logprobs
from memkit.rl.packing import MODES, pack
from memkit.rl.trainer import Trainer
from memkit.world import make_tasks


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def paths_for(device: str) -> list[str]:
    return ["dense", "blocks"] + (["flex"] if device == "cuda" and flex_available() else [])


# ----------------------------------------------------------------------------- part 1
def grpo_breakdown(args, kit) -> None:
    init = "tiny-sft" if sft_checkpoint_path("mem1", kit.world_seed).exists() else "tiny"

    def trainer_for(attention: str) -> Trainer:  # fresh: every update starts from the same weights
        cfg = TrainConfig.from_flags(
            method="mem1",
            algo="grpo",
            init=init,
            objectives=(2,),
            tasks_per_step=args.tasks,
            n_samples=args.n,
            lr=3e-4,
            eval_every=0,
            save_every=0,
            out_dir="",
            device=args.device,
            attention=attention,
        )
        model, tok, wrap = load_init(cfg, kit)
        return Trainer(cfg, model, tok, prompt_wrap(cfg.method, tok, wrap, cfg.prompt), kit, make_accelerator(cfg))

    first = trainer_for("dense")
    sync(args.device)
    t0 = time.perf_counter()
    trajs = first.rollout(first.step_tasks(0), args.n, 1.0, 0)
    sync(args.device)
    t_roll = time.perf_counter() - t0
    print(
        f"== one GRPO step: mem1, policy={init}, packing={first.packing}, device={args.device}, "
        f"threads={torch.get_num_threads()}"
    )
    print(f"rollout generation {t_roll:7.2f} s   ({len(trajs)} trajectories, {sum(len(t.calls) for t in trajs)} calls)")
    if init == "tiny":  # a random policy's trajectories are one garbage call each: nothing to pack
        trajs = rollout("mem1", first.step_tasks(0), kit, policy="oracle", n=args.n, prompt="compact")
        print(
            f"no cached SFT model of mem1 (memkit sft --method mem1): the update below runs on the same tasks' "
            f"oracle trajectories ({len(trajs)}, {sum(len(t.calls) for t in trajs)} calls)"
        )
    print(
        f"{'attention':<9} {'pack+credit':>11} {'old fwd':>8} {'ref fwd':>8} {'upd fwd':>8} {'bwd+step':>8} "
        f"{'update':>8} {'step':>8}   (s, best of {args.repeats})"
    )
    for path in paths_for(args.device):
        best = None
        for _ in range(args.repeats):
            tr = trainer_for(path)
            t = {"old": 0.0, "ref": 0.0, "fwd": 0.0, "exp": 0.0, "mini": 0.0}
            timed(tr, "_experience", t, "exp", args.device)
            timed(tr, "_minibatch", t, "mini", args.device)
            logprobs = tr._logprobs

            def labelled(model, *a, _lp=logprobs, _tr=tr, _t=t, **k):
                key = "fwd" if torch.is_grad_enabled() else ("ref" if model is _tr.ref else "old")
                sync(args.device)
                s = time.perf_counter()
                out = _lp(model, *a, **k)
                sync(args.device)
                _t[key] += time.perf_counter() - s
                return out

            tr._logprobs = labelled
            sync(args.device)
            s = time.perf_counter()
            tr.update(trajs)
            sync(args.device)
            t["update"] = time.perf_counter() - s
            best = t if best is None or t["update"] < best["update"] else best
        t = best
        print(
            f"{path:<9} {t['exp'] - t['old'] - t['ref']:>11.2f} {t['old']:>8.2f} {t['ref']:>8.2f} {t['fwd']:>8.2f} "
            f"{t['mini'] - t['fwd']:>8.2f} {t['update']:>8.2f} {t_roll + t['update']:>8.2f}"
        )


def timed(obj, name: str, acc: dict, key: str, device: str) -> None:
    """Wrap ``obj.name`` so that its wall time adds to ``acc[key]``."""
    fn = getattr(obj, name)

    def wrapper(*a, **k):
        sync(device)
        s = time.perf_counter()
        out = fn(*a, **k)
        sync(device)
        acc[key] += time.perf_counter() - s
        return out

    setattr(obj, name, wrapper)


# ----------------------------------------------------------------------------- part 2
def attention_cells(mask: torch.Tensor, path: str) -> int:
    """Scores a path computes per head and layer for a 2D mask ``[B, 1, L, L]``: dense ``B L^2``,
    blocks its gathered blocks, flex its BlockMask's non-empty 128 x 128 tiles."""
    if path == "blocks":
        return block_plan(mask).n_cells
    if path == "flex":
        bm = flex_block_mask(mask)
        return int((bm.kv_num_blocks.sum() + bm.full_kv_num_blocks.sum()) * bm.BLOCK_SIZE[0] * bm.BLOCK_SIZE[1])
    return mask.shape[0] * mask.shape[-1] ** 2


def packing_ratio(args, kit) -> None:
    tasks = make_tasks(kit.world, n=args.n_trajs, k=args.objectives, seed=args.seed)
    trajs = [t for t in rollout("mem1", tasks, kit, policy="oracle", prompt="compact") if t.valid]
    model = fresh_tiny(kit, 0).model.to(args.device)
    pad = kit.tokenizer.pad_token_id or 0
    micro = [trajs[i : i + args.micro] for i in range(0, len(trajs), args.micro)]
    print(
        f"\n== packed vs separate forward+backward: mem1 oracle, k={args.objectives}, {len(trajs)} trajectories "
        f"({sum(len(t.calls) for t in trajs)} calls), {args.micro} per forward, fresh tiny model"
    )
    batches = {mode: [pack(m, mode, pad) for m in micro] for mode in MODES}

    def flat_logps(mode: str, path: str) -> torch.Tensor:
        """Trained-token log-probs in (trajectory, call, token) order: comparable across modes."""
        out = []
        with torch.no_grad():
            for b in batches[mode]:
                lp = packed_token_logprobs(model, b, attention=path).cpu()
                order = sorted(range(len(lp)), key=lambda r: (int(b.unit_index[r]), int(b.call_index[r])))
                for r in order:
                    for c in sorted(set(b.call_ids[r][b.loss_mask[r] > 0].tolist())):
                        out.append(lp[r][(b.call_ids[r] == c) & (b.loss_mask[r] > 0)])
        return torch.cat(out)

    def fwd_bwd(mode: str, path: str) -> float:
        sync(args.device)
        s = time.perf_counter()
        for b in batches[mode]:
            logp = packed_token_logprobs(model, b, attention=path)
            (logp * b.loss_mask.to(args.device)).sum().backward()
        sync(args.device)
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - s

    def best(mode: str, path: str) -> tuple[float, float]:
        first = fwd_bwd(mode, path)  # flex compiles here
        return first, min([first] + [fwd_bwd(mode, path) for _ in range(args.repeats)])

    ref = {m: flat_logps(m, "dense") for m in MODES}
    _, t_sep = best("separate", "dense")
    cells_sep = sum(b.n_attention_cells for b in batches["separate"])
    print(f"separate   fwd+bwd {t_sep:6.2f} s   cells {cells_sep / 1e6:6.2f}M")
    print(
        f"{'mode':<11} {'attention':<9} {'fwd+bwd s':>9} {'first call':>10} {'x separate':>10} {'cells':>8} "
        f"{'|dlogp| vs dense':>16} {'vs separate':>11}"
    )
    for mode in ("mem1_mask", "mem1_exact"):
        for path in paths_for(args.device):
            first, t = best(mode, path)
            cells = sum(attention_cells(b.attention_mask, path) for b in batches[mode])
            lp = flat_logps(mode, path)
            vs_sep = f"{float((lp - ref['separate']).abs().max()):11.1e}" if mode == "mem1_exact" else f"{'-':>11}"
            print(
                f"{mode:<11} {path:<9} {t:>9.2f} {first:>10.2f} {t / t_sep:>9.2f}x {cells / 1e6:>7.2f}M "
                f"{float((lp - ref[mode]).abs().max()):>16.1e} {vs_sep}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=8, help="GRPO step: tasks (TrainConfig.tasks_per_step)")
    ap.add_argument("--n", type=int, default=4, help="GRPO step: samples per task (group size)")
    ap.add_argument("--objectives", type=int, default=8, help="packing ratio: questions per task (k)")
    ap.add_argument("--n-trajs", type=int, default=2, help="packing ratio: oracle trajectories")
    ap.add_argument("--micro", type=int, default=1, help="packing ratio: trajectories per forward")
    ap.add_argument("--repeats", type=int, default=2, help="timing repeats (best is kept)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--seed", type=int, default=4242, help="packing ratio: task seed")
    ap.add_argument("--skip-step", action="store_true", help="only part 2 (the packing ratio)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as the memkit CLI does
    kit = load_kit(0)
    if not args.skip_step:
        grpo_breakdown(args, kit)
    packing_ratio(args, kit)


if __name__ == "__main__":
    main()
