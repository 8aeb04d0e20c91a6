"""The RL lab: the recipe notebooks 00-03 run with ``SMOKE = False`` and ``memkit reproduce`` runs.

A perfect teacher leaves RL nothing that more SFT cannot reach. The lab's teacher has a memory
flaw as a habit (``forget_earlier`` at 0.65, :data:`memkit.agents.oracle.FLAWS`): once it answers a
later question it drops an earlier answer from memory and answers that slot "unknown". The clone
inherits the habit under greedy decoding; outcome-reward RL has to learn to keep what the answer
needs (MEM1 Tab. 5: RL vs. SFT, both trained on few objectives).

Every format clones 1- and 2-question tasks for 1,500 steps from the pretrained base, the base Mem-T's
clones start from too: the hour-long recipe (docs/findings.md, '`make reproduce` in an hour', has what
it costs against 3,000 steps from scratch). The SFT checkpoints are cached by config, so notebooks 00,
01 and 02 share one MEM1 model and 01 and 03 one MemSearcher model. MemAct's sliding-window baseline
(notebook 05) continues the MemAct clone without its prune tool.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from memkit.agents.base import OracleConfig
from memkit.lab.runs import ensure_sft
from memkit.train.sft import SFTConfig

#: the flawed teacher every lab format clones (plus the default small random mistakes)
LAB_ORACLE = OracleConfig(p_wasted_search=0.05, p_drop_fact=0.05, flaw="forget_earlier", flaw_rate=0.65)

#: the formats the lab trains (notebooks 02, 03, 04 and 05)
LAB_FORMATS = ("mem1", "memsearcher", "mempo", "memact")
#: the head-to-head's formats (notebook 08): ReAct, the full-context baseline, the lab's four and the A-MEM-style
#: retrieval memory (``amem``, a baseline format: :data:`memkit.agents.BASELINE_METHODS`), each cloned alike
H2H_FORMATS = ("react", *LAB_FORMATS, "amem")

#: what the lab's SFT changes from SFTConfig's defaults (steps, not minutes; the base they continue is
#: time-budgeted, so a slower machine's base has had fewer steps: docs/findings.md)
LAB_SFT = dict(objectives=(1, 2), steps=1500, init="base")

#: minutes of RL notebooks 02 and 03 train for. The 3-seed study (docs/findings.md, 'The RL lab')
#: reached its gains by the first evaluations (MEM1 at 40 steps, MemSearcher at 30); 4 minutes are
#: ~80 MEM1 / ~40 MemSearcher steps on one core
LAB_RL_MINUTES = 4


def lab_sft_config(method: str) -> SFTConfig:
    """The lab's SFT recipe for ``method`` (a format outside :data:`H2H_FORMATS` gets the flawed teacher
    with SFTConfig's other defaults)."""
    return SFTConfig(method=method, max_seconds=None, oracle=LAB_ORACLE, **(LAB_SFT if method in H2H_FORMATS else {}))


def ensure_lab_sft(method: str, kit, progress: bool = True) -> Path:
    """The lab's SFT checkpoint of ``method``: cached, trained now when missing."""
    return ensure_sft(method, kit, lab_sft_config(method), progress=progress)


#: MemAct's sliding-window baseline (Table 1): the lab clone taught to work without its prune tool
#: (``schedule="window"``), continued from :func:`lab_sft_config`'s checkpoint for this many steps
LAB_WINDOW = dict(schedule="window", window=3)
LAB_WINDOW_STEPS = 500
#: MemAct's summarisation baseline (Table 1): the 3-record window plus a note the model writes about the
#: records that fall out (``schedule="summary"``); continued from the MemAct clone like the window agent
LAB_SUMMARY = dict(schedule="summary", window=3)


def lab_window_sft_config(method_kwargs: dict | None = None, start: SFTConfig | None = None) -> SFTConfig:
    """SFT of MemAct's sliding-window agent (``method_kwargs`` = :data:`LAB_WINDOW`, the default) or of its
    summarisation agent (:data:`LAB_SUMMARY`): the MemAct clone of ``start`` (default the lab's,
    :func:`lab_sft_config`), continued on its teacher under that schedule (the same questions, fewer steps)."""
    from memkit.lab.policies import sft_cache_key

    start = start or lab_sft_config("memact")
    return replace(start, method_kwargs=dict(method_kwargs or LAB_WINDOW), steps=LAB_WINDOW_STEPS,
                   init="tiny-sft:cfg" + sft_cache_key(start))  # fmt: skip


def ensure_lab_window_sft(kit, progress: bool = True, method_kwargs: dict | None = None) -> Path:
    """The sliding-window MemAct checkpoint (or, with ``method_kwargs=LAB_SUMMARY``, the summarisation
    one): cached, trained now (after the lab's MemAct clone) when missing."""
    ensure_lab_sft("memact", kit, progress=progress)
    return ensure_sft("memact", kit, lab_window_sft_config(method_kwargs), progress=progress)


# ---- the lab's cached models, for `memkit reproduce --jobs` --------------------------------------
@dataclass(frozen=True)
class LabClone:
    """A model the lab notebooks start from, trained once into the cache."""

    name: str
    needs: tuple[str, ...]  # clones trained before this one (it continues them)
    minutes: float  # one-core minutes measured on the 2-core machines (docs/findings.md): scheduling order
    wide: bool = False  # time-budgeted on every core (the base): trained alone, so its steps match the recipe's


#: every cached model of the lab mode; "kit" is the world's tokenizer, which everything else needs
LAB_CLONES = {
    c.name: c
    for c in (
        LabClone("kit", (), 0.2),
        LabClone("base", ("kit",), 8, wide=True),
        LabClone("react", ("base",), 10),  # notebook 08 only; its contexts hold the whole history
        LabClone("amem", ("base",), 6),  # notebook 08 only; 6.1 one-core minutes measured (docs/findings.md)
        *(LabClone(m, ("base",), t) for m, t in zip(LAB_FORMATS, (9, 7, 9, 12))),
        LabClone("memact-window", ("memact",), 5),
        LabClone("memact-summary", ("memact",), 3),  # notebook 08 only
        LabClone("memt-retrieval", ("base",), 6),
        LabClone("memt-construction", ("base",), 7),
    )
}

#: one-core minutes of each notebook's lab run with its clones cached (one seed; the scheduling order);
#: 07 without its SmolLM2 SFT (:data:`LAB_NOTEBOOK_PARAMS`)
LAB_NOTEBOOK_MINUTES = {"00": 0.3, "01": 5.3, "02": 7.2, "03": 6.5, "04": 10.7, "05": 7.3, "06": 7, "07": 4, "08": 29}

#: parameters the lab mode gives a notebook unless ``memkit reproduce --full`` (``make reproduce FULL=1``):
#: the long-horizon studies (02 §9: a 3,000-step clone and 3 RL seeds, ~40 minutes on one core; 04 §8 and 05 §8,
#: :mod:`memkit.lab.long_horizon_arms`: a 3,000-step clone and 3 seeds per arm, ~45 and ~40 minutes; 06 §8, Mem-T on
#: longer streams) and notebook 07's SmolLM2 SFT on CPU (26 minutes on 2 cores for MEM1's, a correctness run no claim
#: rests on, and §7's head-to-head: five more formats' SFT of ``SFT_MINUTES`` each) are skipped
LAB_NOTEBOOK_PARAMS = {**{nb: {"LONG_HORIZON": False} for nb in ("02", "04", "05", "06")}, "07": {"SFT_MINUTES": 0}}

#: parameters the lab mode gives a notebook in the full study (``--full``, or notebooks named with ``--only``) when
#: the run's model is the default tiny one: notebook 07 SFTs a pretrained chat model, and its ``MODEL = "tiny"`` is
#: SMOKE's random 2-layer stand-in on SmolLM2's tokenizer, whose lab-mode minutes of SFT would measure nothing
FULL_STUDY_PARAMS = {"07": {"MODEL": "smollm2-135m"}}

#: notebooks the lab mode runs only with ``memkit reproduce --full`` (``make reproduce FULL=1``) or when
#: named with ``--only``: the head-to-head spends RL minutes on eight contestants and needs the ReAct, A-MEM and
#: summarisation clones
FULL_STUDY_NOTEBOOKS = ("08",)

#: the lab clones each notebook loads (by notebook number)
NOTEBOOK_CLONES = {
    "00": ("mem1",),
    "01": LAB_FORMATS,
    "02": ("mem1",),
    "03": ("memsearcher",),
    "04": ("mempo",),
    "05": ("memact", "memact-window"),
    "06": ("memt-retrieval", "memt-construction"),
    "07": (),  # SmolLM2 + LoRA, trained by the notebook itself (no tiny clone)
    "08": (*H2H_FORMATS, "memact-window", "memact-summary"),
}


def ensure_lab_clone(name: str, progress: bool = False) -> str | None:
    """Train lab clone ``name`` (:data:`LAB_CLONES`) into the cache unless it is there; returns its
    directory (None for "kit"). The recipes are the notebooks' own: the same cache entries."""
    from memkit.lab.kit import load_kit

    if name not in LAB_CLONES:
        raise ValueError(f"no lab clone {name!r}; choose from {', '.join(LAB_CLONES)}")
    kit = load_kit()
    if name in H2H_FORMATS:
        return str(ensure_lab_sft(name, kit, progress=progress))
    if name in ("memact-window", "memact-summary"):
        kw = LAB_SUMMARY if name == "memact-summary" else LAB_WINDOW
        return str(ensure_lab_window_sft(kit, progress=progress, method_kwargs=kw))
    if name == "base":
        from memkit.lab.policies import ensure_base

        return str(ensure_base(kit, progress=progress).path)
    if name == "memt-retrieval":
        from memkit.lab.memt.retrieval import MemTLab, ensure_memt_clone, memt_clone_path

        lab = MemTLab()
        ensure_memt_clone(kit, lab, progress=progress)
        return str(memt_clone_path(kit, lab))
    if name == "memt-construction":
        from memkit.lab.memt.construction import ConstructionLab, construction_clone_path, ensure_construction_clone

        lab = ConstructionLab()
        ensure_construction_clone(kit, lab, progress=progress)
        return str(construction_clone_path(kit, lab))
    return None
