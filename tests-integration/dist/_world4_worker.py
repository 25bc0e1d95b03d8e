"""The 4-rank launch: the collectives checks, then the 4-rank Trainer cases, then the context-
parallel checks (attention Cells, model cases), then the capability probes (kernels that must fail
go last). One msrun start-up instead of three.

Usage: _world4_worker.py WORKDIR CASE [CASE ...] [--cp CP_CASE ...]
  CASE: Trainer cases (see _trainer_worker.CASES); CP_CASE: model cases (_cp_worker.MODEL_CASES).
A case that raises ends the launch (its peers would wait in a collective forever).
"""

from __future__ import annotations

import sys

import _collectives_worker as collectives
from _results import emit
from _world2_worker import run_cases

collectives.run_all()
run_cases(sys.argv)
collectives.run_capabilities()
emit("done", True)
