"""Memory formats: one module per paper (context builder + parser + oracle policy).

=============  ======================================================  ===================
name           context of call t                                       module
=============  ======================================================  ===================
react          question + every output and observation (baseline)      ``react.py``
mem1           question + last ``<think>``/action + last observation   ``mem1.py``
memsearcher    ``<question>`` + ``<memory>`` (memory rewritten per turn) ``memsearcher.py``
mempo          question + last ``<mem>``/``<think>``/action + obs        ``mempo.py``
memact         question + live ``[id]`` records (Prune&Write edits)    ``memact.py``
memt           a conversation chunk / a candidate + related memories   ``memt.py``
               / a question + retrieved memories (Mem-T's store)
amem           question + notes retrieved per question from a store    ``amem.py``
               + last output + obs (A-MEM baseline)
=============  ======================================================  ===================

``METHODS`` are the papers' wiki-QA formats (tasks of k questions); ``BASELINE_METHODS`` are wiki-QA
formats of the papers' baselines (A-MEM), built by ``get_method`` and accepted by ``memkit rollout`` /
``sft`` / ``train`` but kept out of ``METHODS``, whose prompts and teachers' outputs train the kit's
tokenizer (:func:`memkit.lab.kit.world_tokenizer`): adding a name there would change it and every
cached model. ``STREAM_METHODS`` read conversation streams (:mod:`memkit.rollout.streams`,
:mod:`memkit.lab.memt.evaluation`).

``get_method(name, **kw)`` builds one; keyword arguments go to its constructor
(``memsearcher``: ``memory_budget_words``, ``on_over_budget``; ``memact``: ``prune_after``; ``amem``: ``r``).
"""

from __future__ import annotations

from memkit.agents.amem import AMem
from memkit.agents.base import AgentState, CallSpec, Env, Method, OracleConfig, Parsed, Segment
from memkit.agents.mem1 import MEM1
from memkit.agents.memact import MemAct
from memkit.agents.mempo import MemPO
from memkit.agents.memsearcher import MemSearcher
from memkit.agents.memt import MemT
from memkit.agents.react import ReAct

METHODS = ("react", "mem1", "memsearcher", "mempo", "memact")
BASELINE_METHODS = ("amem",)
STREAM_METHODS = ("memt",)
#: every wiki-QA format ``get_method`` builds (the papers' and the baselines'), and every format
QA_METHODS = METHODS + BASELINE_METHODS
ALL_METHODS = QA_METHODS + STREAM_METHODS
_CLASSES = {
    "react": ReAct,
    "mem1": MEM1,
    "memsearcher": MemSearcher,
    "mempo": MemPO,
    "memact": MemAct,
    "amem": AMem,
    "memt": MemT,
}


def get_method(name: str, **kw) -> Method:
    """The memory format called ``name`` (case-insensitive); unknown names list the choices."""
    key = str(name).strip().lower()
    if key not in _CLASSES:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(ALL_METHODS)}")
    return _CLASSES[key](**kw)


__all__ = [
    "METHODS",
    "BASELINE_METHODS",
    "QA_METHODS",
    "ALL_METHODS",
    "STREAM_METHODS",
    "get_method",
    "Method",
    "AgentState",
    "CallSpec",
    "Env",
    "OracleConfig",
    "Parsed",
    "Segment",
    "ReAct",
    "MEM1",
    "MemSearcher",
    "MemPO",
    "MemAct",
    "AMem",
    "MemT",
]
