"""A training run's files: per-step logs (JSONL + CSV), eval log, atomic checkpoints.

Layout of ``out_dir``::

    metrics.jsonl  metrics.csv      one row per step (CSV rewritten whole, so new columns are fine)
    eval.jsonl                      one row per (eval step, k)
    checkpoints/step-000010/        accelerate state (models, optimizers, schedulers, RNG per process),
                                    memkit.json (step, history, eval history, config),
                                    policy/ (save_pretrained + tokenizer: ``load_policy(path/"policy")``)
    checkpoints/latest              name of the newest *complete* checkpoint

A checkpoint is written to ``.step-N.tmp`` and renamed when complete; ``latest`` is then
replaced atomically. A crash at any point leaves a complete checkpoint to resume from: the one
``latest`` names, or else the newest complete ``step-*`` (incomplete ones are skipped with a
message). A log line torn by a crash is dropped on resume, with every row after the checkpoint
(the logs are rewritten from the checkpoint's history).
Only the main process writes shared files; every process writes its own RNG state.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import sys
from pathlib import Path

from memkit.core.io import atomic_write_text, kill_point, latest_checkpoint, replace_dir
from memkit.models.adapters import save_policy


class RunFiles:
    def __init__(self, out_dir: str | Path, accelerator):
        self.dir = Path(out_dir)
        self.acc = accelerator
        self.ckpt_dir = self.dir / "checkpoints"

    @property
    def main(self) -> bool:
        return self.acc.is_main_process

    # ------------------------------------------------------------------------- logs
    def log_step(self, row: dict, history: list[dict]) -> None:
        if not self.main:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        line = json.dumps(row) + "\n"
        with open(self.dir / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(line[: len(line) // 2])
            f.flush()
            kill_point("log-append")  # the kill-and-resume test tears this line
            f.write(line[len(line) // 2 :])
        atomic_write_text(self.dir / "metrics.csv", to_csv(history))

    def log_eval(self, rows: list[dict]) -> None:
        if not self.main or not rows:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / "eval.jsonl", "a", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)

    def rewrite_logs(self, history: list[dict], eval_history: list[dict]) -> None:
        """On resume: logs = the checkpoint's history (drops rows of steps after it)."""
        if not self.main:
            return
        atomic_write_text(self.dir / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in history))
        atomic_write_text(self.dir / "metrics.csv", to_csv(history))
        atomic_write_text(self.dir / "eval.jsonl", "".join(json.dumps(r) + "\n" for r in eval_history))

    # ------------------------------------------------------------------------- checkpoints
    def latest(self) -> Path | None:
        """The checkpoint to resume from (:func:`memkit.core.io.latest_checkpoint`); says which
        incomplete ones it skipped."""
        path = latest_checkpoint(self.ckpt_dir)
        skipped = (
            sorted(
                p.name
                for p in self.ckpt_dir.glob("*step-*")
                if p.is_dir() and p != path and not (p / "memkit.json").is_file()
            )
            if self.ckpt_dir.is_dir()
            else []
        )
        pointer = self.ckpt_dir / "latest"
        named = pointer.read_text().strip() if pointer.is_file() else None
        if named and (path is None or named != path.name) and named not in skipped:
            skipped.append(f"{named} (named by latest, not on disk)")
        if skipped and self.main:
            print(
                f"memkit: skipped incomplete checkpoint(s) {', '.join(skipped)}; resuming from "
                f"{path.name if path else 'nothing'}",
                file=sys.stderr,
            )
        return path

    def save(self, step: int, meta: dict, model, tokenizer, keep: int) -> Path:
        """Save everything needed to continue exactly; returns the checkpoint directory."""
        name = f"step-{step:06d}"
        tmp, final = self.ckpt_dir / f".{name}.tmp", self.ckpt_dir / name
        if self.main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.acc.wait_for_everyone()
        self.acc.save_state(str(tmp), safe_serialization=False)
        state_dict = self.acc.get_state_dict(model)  # collective under FSDP / ZeRO-3
        if self.main:
            save_policy(self.acc.unwrap_model(model), tokenizer, tmp / "policy", state_dict)  # + an adapter's base
            kill_point("checkpoint-save")  # the kill-and-resume test stops here: weights written, no memkit.json
            (tmp / "memkit.json").write_text(json.dumps(meta, indent=1, default=str))
        self.acc.wait_for_everyone()
        if self.main:
            replace_dir(tmp, final)  # an older save of this step is moved aside, then deleted
            atomic_write_text(self.ckpt_dir / "latest", name)
            old = sorted(p for p in self.ckpt_dir.glob("step-*") if p.is_dir() and p != final)
            for p in old[: max(0, len(old) - (keep - 1))]:
                shutil.rmtree(p, ignore_errors=True)
        self.acc.wait_for_everyone()
        return final

    def meta(self, path: Path | None = None) -> tuple[Path, dict]:
        """``(checkpoint dir, its memkit.json)``; ``path`` defaults to the latest checkpoint."""
        path = Path(path) if path is not None else self.latest()
        if path is None or not (path / "memkit.json").is_file():
            raise FileNotFoundError(
                f"no checkpoint to resume in {self.ckpt_dir}; start without --resume "
                "(or point out_dir at the run to continue)"
            )
        return path, json.loads((path / "memkit.json").read_text())

    def load(self, path: Path) -> None:
        """Restore models, optimizers, schedulers and every process's RNG from ``path``."""
        self.acc.load_state(str(path))


def to_csv(rows: list[dict]) -> str:
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()
