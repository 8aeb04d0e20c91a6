"""The rollout-backend seam: what the rollout engine asks of an inference engine, and how a trainer
keeps that engine on the policy it is training.

    backend.generate(prompts, max_new_tokens, stop=(), temperature=1.0, top_p=1.0, generator=None)
        -> list[Generation]            # token ids in, one Generation (ids, log-probs, text, finish) per prompt
    backend.sync_weights(model)        # after the optimizer steps of an update: sample from the new policy

A *backend factory* ``(model, tokenizer) -> backend`` is what the trainer (``Trainer(backend=...)``,
``memkit.lab.runs.train``), the evaluation (``memkit.lab.evaluation.rollout`` / ``evaluate``) and
:class:`~memkit.models.loading.LoadedModel` take; :func:`hf_backend` is the default.

:class:`~memkit.models.generation.HFBackend` decodes with the training model itself, so its
``sync_weights`` only points it at the model it is given (nothing is copied). An engine that keeps
its own copy of the weights (vLLM, a server) loads the new ``state_dict`` there: the Trainer calls
``sync_weights`` after every update and after a resume, so such an engine is one class.
"""

from __future__ import annotations

import functools
from typing import Callable, Protocol, Sequence, runtime_checkable

from memkit.models.generation import Generation, HFBackend


@runtime_checkable
class RolloutBackend(Protocol):
    """What :class:`memkit.rollout.engine.ModelPolicy` and the Trainer call on an engine."""

    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        stop: Sequence[str] = (),
        temperature: float = 1.0,
        top_p: float = 1.0,
        generator=None,
    ) -> list[Generation]: ...

    def sync_weights(self, model) -> None: ...


#: ``(model, tokenizer) -> RolloutBackend``
BackendFactory = Callable[[object, object], RolloutBackend]


def hf_backend(model, tokenizer) -> HFBackend:
    """The default factory: memkit's HF decode loop over ``model`` itself."""
    return HFBackend(model, tokenizer)


def named_backend(name: str, dtype: str = "auto") -> BackendFactory | None:
    """The factory of a ``--backend`` name: ``hf`` -> None (the default loop), ``vllm`` ->
    :func:`memkit.models.vllm_backend.vllm_backend` (an ``ImportError`` naming the install when vLLM is
    missing), its engine in ``dtype`` (``--backend-dtype``; ``auto`` = the policy's)."""
    if name == "hf":
        if dtype != "auto":
            raise ValueError(f"the HF loop decodes with the training model itself (dtype {dtype!r}): use auto")
        return None
    if name == "vllm":
        from memkit.models.vllm_backend import require_vllm, vllm_backend

        require_vllm()
        return vllm_backend if dtype == "auto" else functools.partial(vllm_backend, dtype=dtype)
    raise ValueError(f"unknown rollout backend {name!r}; choose hf or vllm")


def check_backend(backend) -> RolloutBackend:
    """``backend`` if it has the protocol's methods, else one ``TypeError`` naming what is missing."""
    missing = [m for m in ("generate", "sync_weights") if not callable(getattr(backend, m, None))]
    if missing:
        raise TypeError(
            f"{type(backend).__name__} is not a rollout backend: it lacks {', '.join(missing)} "
            "(memkit.models.backend.RolloutBackend); a factory must return one"
        )
    return backend


__all__ = ["RolloutBackend", "BackendFactory", "hf_backend", "named_backend", "check_backend"]
