"""Decoding in lockstep over sharded weights (FSDP2, DeepSpeed ZeRO-3): every rank, every forward.

Under FSDP2 a forward all-gathers each layer's parameters from every rank, so a rank that stops
decoding while another still decodes leaves that one waiting for ever: ranks roll out different
tasks, whose episodes take different numbers of turns, calls and tokens (HF's
``generate(synced_gpus=True)`` answers the same problem for one ``generate``; an agent's rollout is
many of them). :class:`Lockstep` wraps the model a backend decodes with: before each forward the
ranks agree, in one all-reduce, that a round happens; a rank with nothing left to decode calls
:meth:`Lockstep.join`, which runs a one-token forward in every round another rank still decodes:

    round r, rank i:  a_i = 1 (a forward of its own) or 0 (joined)      any = max_i a_i (all-reduce)
                      a_i = 1           -> its forward
                      a_i = 0, any = 1  -> a dummy forward (1 token; the same all-gathers)
                      any = 0           -> every rank has joined: the rollout is over

So ``HFBackend(Lockstep(model), tok)`` under ``run_rollouts`` (any number of ``generate`` calls, prefill
buckets and decode steps per rank), then ``join()``, leaves every rank's trajectories what one
unsharded process would write (tests/rl/test_fsdp2.py, torch's ``fully_shard`` over gloo).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class Lockstep:
    """``module`` (an FSDP2-sharded causal LM) whose forwards are collective rounds (module doc).
    Every other attribute (``config``, ``parameters``, ``eval``...) is the module's, so a backend
    uses it as the model. ``rounds`` / ``dummies``: this rank's own and joined forwards."""

    def __init__(self, module, group=None):
        self.module, self.group = module, group
        self.rounds = self.dummies = 0

    def __getattr__(self, name):  # only for names this object does not have
        return getattr(self.module, name)

    def _any(self, active: bool) -> bool:
        device = next(self.module.parameters()).device
        flag = torch.tensor([int(active)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return bool(flag.item())

    def __call__(self, *args, **kwargs):
        self._any(True)
        self.rounds += 1
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def join(self) -> int:
        """Follow the other ranks' forwards until every rank has joined; returns the dummy forwards run."""
        device, start = next(self.module.parameters()).device, self.dummies
        while self._any(False):
            self.module(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device), use_cache=False)
            self.dummies += 1
        return self.dummies - start


__all__ = ["Lockstep"]
