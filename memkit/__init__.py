"""memkit: five papers on LLM agents that learn to manage their own memory with RL, on one substrate.

The tree is the layer diagram (``tests/test_layers.py``), bottom to top: ``core`` → ``world``,
``retrieval``, ``metrics`` → ``models`` → ``agents``, ``envs``, ``rollout`` → ``rl``, ``train`` →
``lab`` → ``course``, ``viz`` → ``cli``.

Where each paper lives: :data:`PAPERS` / :func:`paper`. ``memkit.paper("mempo")`` names its memory
format, credit rule, packing, notebook and lab recipe::

    >>> import memkit
    >>> p = memkit.paper("mempo")
    >>> p.method, p.credit, p.notebook
    ('mempo', 'mempo', 'notebooks/04_mempo_memory_reward.ipynb')

The names in :data:`_HOME` (the kit, a rollout, an evaluation, the trainer and its config, the SFT
config and the lab's clones) load their module on first use (PEP 562), so ``import memkit`` costs
no torch import and ``memkit --help`` stays fast.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Paper:
    """One paper's place in memkit. ``credit`` and ``packing`` are read from the memory format's
    class (``Method.default_credit`` / ``default_packing``), so they have one definition."""

    key: str
    title: str
    file: str  # its text, beside the project: ../shared/papers/<file>
    method: str  # memkit.agents.get_method name
    notebook: str  # the notebook that teaches it
    recipe: str  # the lab's recipe (dotted path) that the notebook and `memkit reproduce` share

    @property
    def credit(self) -> str:
        """The credit rule's name in ``memkit.rl.credit.CREDIT_RULES``."""
        from memkit.agents import get_method

        return get_method(self.method).default_credit

    @property
    def packing(self) -> str:
        """The packing mode the trainer uses for this format by default (``memkit.rl.packing``)."""
        from memkit.agents import get_method

        return get_method(self.method).default_packing


#: the five papers, in the course's order
PAPERS = {p.key: p for p in (
    Paper("mem1", "MEM1: Learning to Synergize Memory and Reasoning for Efficient Long-Horizon Agents",
          "mem1.md", "mem1", "notebooks/02_mem1_masked_trajectories.ipynb", "memkit.lab.recipes.lab_sft_config"),
    Paper("memsearcher", "MemSearcher: Training LLMs to Reason, Search and Manage Memory via End-to-End RL",
          "memsearcher.md", "memsearcher", "notebooks/03_memsearcher_multicontext_grpo.ipynb",
          "memkit.lab.recipes.lab_sft_config"),
    Paper("mempo", "MemPO: Self-Memory Policy Optimization for Long-Horizon Agents", "mempo.md", "mempo",
          "notebooks/04_mempo_memory_reward.ipynb", "memkit.lab.recipes.lab_sft_config"),
    Paper("memact", "Memory as Action: Autonomous Context Curation for Long-Horizon Agentic Tasks", "memact.md",
          "memact", "notebooks/05_memact_dcpo.ipynb", "memkit.lab.recipes.lab_sft_config"),
    Paper("memt", "Mem-T: Densifying Rewards for Long-Horizon Memory Agents", "mem-t.md", "memt",
          "notebooks/06_memt_tree_backprop.ipynb", "memkit.lab.memt.retrieval.MemTLab"),
)}


def paper(name: str) -> Paper:
    """The :class:`Paper` called ``name`` (case-insensitive; "mem-t" and "memt" both work)."""
    key = str(name).strip().lower().replace("-", "")
    if key not in PAPERS:
        raise ValueError(f"no paper {name!r}; choose from {', '.join(PAPERS)}")
    return PAPERS[key]


#: public name -> the module that defines it (loaded on first use)
_HOME = {
    "load_kit": "memkit.lab.kit",
    **dict.fromkeys(("rollout", "evaluate"), "memkit.lab.evaluation"),
    **dict.fromkeys(("METHODS", "get_method"), "memkit.agents"),
    "make_tasks": "memkit.world",
    **dict.fromkeys(("format_table", "summarize"), "memkit.metrics.qa"),
    "SFTConfig": "memkit.train.config",
    "TrainConfig": "memkit.rl.config",
    "Trainer": "memkit.rl.trainer",
    **dict.fromkeys(("ensure_lab_sft", "ensure_lab_clone", "LAB_CLONES"), "memkit.lab.recipes"),
}


def __getattr__(name: str):
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'memkit' has no attribute {name!r}")


__all__ = ["PAPERS", "Paper", "paper", *_HOME]
