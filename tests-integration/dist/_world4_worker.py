"""The 4-rank launch: the collectives checks, then the 4-rank Trainer cases, then the context-
parallel checks (attention Cells, model cases), then the capability probes (kernels that must fail
go last). One msrun start-up instead of three.

Usage: _world4_worker.py WORKDIR CASE [CASE ...] [--cp CP_CASE ...]
  CASE: Trainer cases (see _trainer_worker.CASES); CP_CASE: model cases (_cp_worker.MODEL_CASES).
A case that raises ends the launch (its peers would wait in a collective forever).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import _collectives_worker as collectives
import _cp_worker as cp
import _trainer_worker as trainer
from _results import emit
from _world2_worker import split_cases

collectives.run_all()
logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s", stream=sys.stdout)
cases, cp_cases = split_cases(sys.argv[2:])
for case in cases:
    trainer.run(Path(sys.argv[1]), case)
if "--cp" in sys.argv:
    cp.main(cp_cases)
collectives.run_capabilities()
emit("done", True)
