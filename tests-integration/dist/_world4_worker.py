"""The 4-rank launch: the collectives checks, then the 4-rank Trainer cases, then the capability
probes (kernels that must fail go last). One msrun start-up instead of two.

Usage: _world4_worker.py WORKDIR CASE [CASE ...] (Trainer cases, see _trainer_worker.CASES).
A Trainer case that raises ends the launch (its peers would wait in a collective forever).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import _collectives_worker as collectives
import _trainer_worker as trainer
from _results import emit

collectives.run_all()
logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s", stream=sys.stdout)
for case in sys.argv[2:]:
    trainer.run(Path(sys.argv[1]), case)
collectives.run_capabilities()
emit("done", True)
