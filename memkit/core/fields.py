"""Flat names of a config dataclass's knobs, nested groups included: the one rule that names a
knob's command-line flag and the key older checkpoints stored it under.

A nested group (a field whose default is a dataclass: ``TrainConfig.eval``, ``SFTConfig.oracle``)
puts its field metadata's ``prefix`` before each inner field's name (default: the group's name and
``_``, so ``eval.every`` is ``eval_every``, the flag ``--eval-every``; ``""`` for a group whose knobs
keep their own names, ``TrainConfig.runtime``), and an inner field's metadata ``flat`` replaces the
whole flat name (``critic.gamma`` is ``gamma``; ``lora.enabled`` is ``lora``).
"""

from __future__ import annotations

from dataclasses import MISSING, fields, is_dataclass


def flat_names(cls, prefix: str = "", path: str = ""):
    """``(dotted path, flat name, field)`` of every leaf field of dataclass ``cls``: ``("eval.every",
    "eval_every", <field>)``. The flag is ``"--" + flat.replace("_", "-")``."""
    for f in fields(cls):
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        if is_dataclass(default):
            yield from flat_names(type(default), prefix + f.metadata.get("prefix", f.name + "_"), path + f.name + ".")
        else:
            yield path + f.name, f.metadata.get("flat", prefix + f.name), f


__all__ = ["flat_names"]
