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

Everything the notebooks call is an attribute of ``memkit`` (:data:`_EXPORTS`, by defining module), so
a notebook imports one name, as d2l's chapters do::

    import memkit as mk
    kit = mk.load_kit()
    results = mk.evaluate("mem1", kit, objectives=(2,), n_tasks=8)  # {k: (summary, trajectories)}

Each name loads its module on first use (PEP 562), so ``import memkit`` costs no torch import and
``memkit --help`` stays fast; ``mk.<name>.__module__`` says where it lives.
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
PAPERS = {
    p.key: p
    for p in (
        Paper(
            "mem1",
            "MEM1: Learning to Synergize Memory and Reasoning for Efficient Long-Horizon Agents",
            "mem1.md",
            "mem1",
            "notebooks/02_mem1_masked_trajectories.ipynb",
            "memkit.lab.recipes.lab_sft_config",
        ),
        Paper(
            "memsearcher",
            "MemSearcher: Training LLMs to Reason, Search and Manage Memory via End-to-End RL",
            "memsearcher.md",
            "memsearcher",
            "notebooks/03_memsearcher_multicontext_grpo.ipynb",
            "memkit.lab.recipes.lab_sft_config",
        ),
        Paper(
            "mempo",
            "MemPO: Self-Memory Policy Optimization for Long-Horizon Agents",
            "mempo.md",
            "mempo",
            "notebooks/04_mempo_memory_reward.ipynb",
            "memkit.lab.recipes.lab_sft_config",
        ),
        Paper(
            "memact",
            "Memory as Action: Autonomous Context Curation for Long-Horizon Agentic Tasks",
            "memact.md",
            "memact",
            "notebooks/05_memact_dcpo.ipynb",
            "memkit.lab.recipes.lab_sft_config",
        ),
        Paper(
            "memt",
            "Mem-T: Densifying Rewards for Long-Horizon Memory Agents",
            "mem-t.md",
            "memt",
            "notebooks/06_memt_tree_backprop.ipynb",
            "memkit.lab.memt.retrieval.MemTLab",
        ),
    )
}


def paper(name: str) -> Paper:
    """The :class:`Paper` called ``name`` (case-insensitive; "mem-t" and "memt" both work)."""
    key = str(name).strip().lower().replace("-", "")
    if key not in PAPERS:
        raise ValueError(f"no paper {name!r}; choose from {', '.join(PAPERS)}")
    return PAPERS[key]


#: the public names, by the module that defines them (or its package's re-export): everything the
#: notebooks call, so a notebook needs one import (``import memkit as mk``; d2l's ``d2l.``). The lab's
#: ``rollout`` is not among them: ``memkit.rollout`` is the rollout package (import the function from
#: ``memkit.lab.evaluation``).
_EXPORTS = {
    "memkit.core.cpu": ("notebook_cpu_setup",),
    "memkit.core.trajectory": ("TrainingUnit",),
    "memkit.world": (
        "compose_multi_objective",
        "make_conversation",
        "make_tasks",
        "offline_real_set",
        "question_split",
    ),
    "memkit.world.streams": ("make_conversations",),
    "memkit.world.task_sets": ("held_out_tasks", "training_tasks"),
    "memkit.metrics.qa": ("f1", "format_table", "summarize"),
    "memkit.metrics.efficiency": ("context_tokens_per_turn", "dependency", "peak_tokens"),
    "memkit.models": ("load_policy", "LoadedModel", "sequence_logprobs", "trained_k_docs", "is_chat"),
    "memkit.models.smollm": ("smollm2_shape_check",),
    "memkit.models.backend": ("named_backend",),
    "memkit.agents": ("get_method", "METHODS", "OracleConfig"),
    "memkit.agents.tags": ("extract", "words"),
    "memkit.agents.mem1": ("MEM1", "turns_left_hint"),
    "memkit.agents.memt": ("MemT",),
    "memkit.rollout.engine": ("OraclePolicy", "RolloutConfig", "to_trajectory"),
    "memkit.rollout.streams": ("build_memories",),
    "memkit.rollout.trees": ("grow_trees", "TreeConfig"),
    "memkit.train.sft": ("SFTConfig",),
    "memkit.rl.choices": ("PACKING_MODES",),
    "memkit.rl.config": ("TrainConfig",),
    "memkit.rl.groups": ("DataConfig", "LoRAConfig"),
    "memkit.rl.rules": ("DCPOConfig", "MemPOConfig", "MoTConfig"),
    "memkit.rl.advantages": (
        "broadcast_to_calls",
        "broadcast_to_calls_loop",
        "grpo_advantages",
        "grpo_advantages_loop",
    ),
    "memkit.rl.credit": ("CreditBatch", "get_credit", "trajectory_gae"),
    "memkit.rl.critic": ("loss_weights",),
    "memkit.rl.losses": ("token_logprobs",),
    "memkit.rl.packing": ("pack", "layout_row"),
    "memkit.rl.row_pieces": ("row_pieces",),
    "memkit.rl.packed_forward": ("mask_form_logit_gap", "packed_token_logprobs", "packing_gap"),
    "memkit.rl.update": ("Learner",),
    "memkit.rl.engines": ("make_accelerator",),
    "memkit.rl.trainer": ("Trainer",),
    "memkit.rl.headroom": ("exploration_headroom", "slot_em"),
    "memkit.rl.memory_reward": ("answer_probability", "memory_probes", "memory_span", "score_memories"),
    "memkit.rl.segments": ("dcpo_units", "sample_segments", "sampler_draws", "segment_calls", "segment_units"),
    "memkit.rl.mot": (
        "construction_ops",
        "hindsight_filter",
        "hindsight_scores",
        "mot_units",
        "node_rewards",
        "score_query",
        "tree_advantages",
        "tree_nodes",
    ),
    "memkit.lab.kit": ("load_kit",),
    "memkit.lab.policies": ("fresh_tiny", "load_init", "prompt_wrap"),
    "memkit.lab.evaluation": ("compare_engines", "evaluate", "measure_headroom", "same_ids"),
    "memkit.lab.compare": (
        "SFT_TAG",
        "by_method",
        "compare_runs",
        "draw_pareto",
        "evaluated",
        "format_compare",
        "method_label",
        "pareto_front",
        "plot_pareto",
    ),
    "memkit.lab.runs": ("arm_table", "ensure_sft", "train_arms"),
    "memkit.lab.real": ("data_kit", "question_set", "REAL_K_DOCS"),
    "memkit.lab.real_compare": ("real_h2h", "real_sft_config"),
    "memkit.lab.long_horizon": ("long_horizon_study", "long_horizon_summary"),
    "memkit.lab.long_horizon_arms": (
        "memact_study",
        "memact_summary",
        "mempo_study",
        "mempo_summary",
        "memt_study",
        "memt_summary",
    ),
    "memkit.lab.recipes": (
        "ensure_lab_clone",
        "ensure_lab_sft",
        "ensure_lab_window_sft",
        "LAB_CLONES",
        "LAB_FORMATS",
        "H2H_FORMATS",
        "LAB_ORACLE",
        "LAB_RL_MINUTES",
        "LAB_WINDOW",
        "LAB_SUMMARY",
    ),
    "memkit.lab.memt.retrieval": (
        "answer_with",
        "built_stores",
        "ensure_memt_clone",
        "f1_by_category",
        "MemTLab",
        "RETRIEVAL_ARMS",
        "run_arm",
    ),
    "memkit.lab.memt.construction": (
        "CONSTRUCTION_ARMS",
        "ConstructionLab",
        "ensure_construction_clone",
        "op_examples",
        "OpPool",
        "run_construction_arms",
        "store_quality",
    ),
    "memkit.lab.memt.evaluation": ("evaluate_streams", "format_stream_table"),
    "memkit.course.judges": ("seed_spread",),
    "memkit.viz": ("to_html", "TraceViewer", "TreeViewer"),
    "memkit.viz.mask": ("MaskViewer", "plot_mask"),
}

#: public name -> the module that defines it (loaded on first use)
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str):
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'memkit' has no attribute {name!r}")


def __dir__() -> list[str]:  # tab completion in a notebook lists the public names
    return sorted({*globals(), *_HOME})


__all__ = ["PAPERS", "Paper", "paper", *_HOME]
