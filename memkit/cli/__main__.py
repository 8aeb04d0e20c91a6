"""``python -m memkit.cli`` (``accelerate launch -m memkit.cli train ...``, ``torchrun -m memkit.cli ...``)."""

import sys

from memkit.cli import main

sys.exit(main())
