"""The 4-rank launch: the collectives checks, then the 4-rank parity cases, then the capability
probes (kernels that must fail go last). One msrun start-up instead of two.

Usage: _world4_worker.py CASE [CASE ...] (parity cases, see _parity_worker.CASES).
"""

from __future__ import annotations

import sys

import _collectives_worker as collectives
import _parity_worker as parity
from _results import emit

collectives.run_all()
parity.main(sys.argv[1:])
collectives.run_capabilities()
emit("done", True)
