"""The RL lab: the recipe notebooks 00-03 run with ``SMOKE = False`` and ``memkit reproduce`` runs.

A perfect teacher leaves RL nothing that more SFT cannot reach. The lab's teacher has a memory
flaw as a habit (``forget_earlier`` at 0.65, :data:`memkit.agents.oracle.FLAWS`): once it answers a
later question it drops an earlier answer from memory and answers that slot "unknown". The clone
inherits the habit under greedy decoding; outcome-reward RL has to learn to keep what the answer
needs (MEM1 Tab. 5: RL vs. SFT, both trained on few objectives).

Every format clones 1- and 2-question tasks for 3,000 steps (the measured recipe: docs/findings.md,
'The RL lab'). The SFT checkpoints are cached by config, so notebooks 00, 01 and 02 share one MEM1
model and 01 and 03 one MemSearcher model. MemAct's sliding-window baseline (notebook 05) continues
the MemAct clone without its prune tool.
"""
from __future__ import annotations

from pathlib import Path

from memkit.agents.base import OracleConfig
from memkit.sft import SFTConfig
from memkit.training import ensure_sft

#: the flawed teacher every lab format clones (plus the default small random mistakes)
LAB_ORACLE = OracleConfig(p_wasted_search=0.05, p_drop_fact=0.05, flaw="forget_earlier", flaw_rate=0.65)

#: the formats the lab trains (notebooks 02, 03, 04 and 05)
LAB_FORMATS = ("mem1", "memsearcher", "mempo", "memact")

#: what the lab's SFT changes from SFTConfig's defaults (steps, not minutes: the same model on any machine)
LAB_SFT = dict(objectives=(1, 2), steps=3000)

#: minutes of RL each lab notebook trains for (the measured gains: docs/findings.md, 'The RL lab')
LAB_RL_MINUTES = 10


def lab_sft_config(method: str) -> SFTConfig:
    """The lab's SFT recipe for ``method`` (a format outside :data:`LAB_FORMATS` gets the flawed teacher
    with SFTConfig's other defaults)."""
    return SFTConfig(method=method, max_seconds=None, oracle=LAB_ORACLE, **(LAB_SFT if method in LAB_FORMATS else {}))


def ensure_lab_sft(method: str, kit, progress: bool = True) -> Path:
    """The lab's SFT checkpoint of ``method``: cached, trained now when missing."""
    return ensure_sft(method, kit, lab_sft_config(method), progress=progress)


#: MemAct's sliding-window baseline (Table 1): the lab clone taught to work without its prune tool
#: (``schedule="window"``), continued from :func:`lab_sft_config`'s checkpoint for this many steps
LAB_WINDOW = dict(schedule="window", window=3)
LAB_WINDOW_STEPS = 1000


def lab_window_sft_config() -> SFTConfig:
    """SFT of MemAct's sliding-window agent: the lab's MemAct clone, continued on the flawed teacher
    under a 3-record window and no prune tool (the same questions and teacher, fewer steps)."""
    from memkit.policies import sft_cache_key

    return SFTConfig(method="memact", method_kwargs=dict(LAB_WINDOW), max_seconds=None, oracle=LAB_ORACLE,
                     objectives=LAB_SFT["objectives"], steps=LAB_WINDOW_STEPS,
                     init="tiny-sft:cfg" + sft_cache_key(lab_sft_config("memact")))


def ensure_lab_window_sft(kit, progress: bool = True) -> Path:
    """The sliding-window MemAct checkpoint: cached, trained now (after the lab's MemAct clone) when missing."""
    ensure_lab_sft("memact", kit, progress=progress)
    return ensure_sft("memact", kit, lab_window_sft_config(), progress=progress)
