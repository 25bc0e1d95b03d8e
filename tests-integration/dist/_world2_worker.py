"""The 2-rank launch: the 2-rank Trainer cases, then the context-parallel checks (attention Cells
against float64 numpy, then the model cases), then FSDP gather prefetch (_prefetch_check.py).
One msrun start-up instead of three.

Usage: _world2_worker.py WORKDIR CASE [CASE ...] [--cp CP_CASE ...] [--prefetch]
  CASE: Trainer cases (see _trainer_worker.CASES); CP_CASE: model cases (_cp_worker.MODEL_CASES).
A case that raises ends the launch (its peers would wait in a collective forever).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import _cp_worker as cp
import _prefetch_check as prefetch
import _trainer_worker as trainer


def split_cases(argv: list[str]) -> tuple[list[str], list[str]]:
    """(Trainer cases, CP model cases) of `CASE ... [--cp CP_CASE ...] [--prefetch]`."""
    argv = [a for a in argv if a != "--prefetch"]
    if "--cp" not in argv:
        return argv, []
    at = argv.index("--cp")
    return argv[:at], argv[at + 1:]


def run_cases(argv: list[str]) -> None:
    """`WORKDIR CASE ... [--cp CP_CASE ...]` (argv[1:]): the Trainer cases, then the CP checks."""
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s", stream=sys.stdout)
    cases, cp_cases = split_cases(argv[2:])
    for case in cases:
        trainer.run(Path(argv[1]), case)
    if "--cp" in argv:
        cp.main(cp_cases)
    if "--prefetch" in argv:
        prefetch.main()


if __name__ == "__main__":
    run_cases(sys.argv)
