"""Credit assignment: the registry and every rule in it (:mod:`memkit.rl.credit.registry` holds the
registry and the generic rules ``grpo``, ``multi_context``, ``gae``; each paper's own rule registers
itself: ``mempo`` in :mod:`memkit.rl.credit.mempo` (its memory reward R_M in
:mod:`memkit.rl.memory_reward`), ``dcpo`` beside its math in :mod:`memkit.rl.segments`, ``mot`` in
:mod:`memkit.rl.mot`).

Importing this package loads all of them, so ``CREDIT_RULES`` and ``get_credit`` see every rule.
"""

from memkit.rl import mot, segments  # noqa: F401,E402  register `mot`, `dcpo`
from memkit.rl.credit import mempo  # noqa: F401,E402  register `mempo`
from memkit.rl.credit.registry import *  # noqa: F401,F403  the registry and the generic rules
from memkit.rl.credit.registry import __all__  # noqa: F401  the same public names
