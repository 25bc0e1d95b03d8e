"""Where the benchmarks find their references' interpreter: torch 2.13 CPU and megatron-core 0.16.1.

They live in their own venv, `benchmarks/.work/torchvenv`, which the nox `bench` session makes with
pip from `requirements-reference.txt` (pip, not uv: pip finds the local CPU wheel of torch through
this machine's pip configuration, where uv would download a multi-GB CUDA build). Another
interpreter can be named with MF_BENCH_TORCH_PYTHON; the one running the benchmark is tried too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REFERENCE_VENV = HERE / ".work" / "torchvenv"
SETUP_HINT = ("./bootstrap nox -s bench sets it up; by hand: python3 -m venv benchmarks/.work/torchvenv && "
              "benchmarks/.work/torchvenv/bin/pip install -r benchmarks/requirements-reference.txt")


def reference_python(probe: str) -> str | None:
    """The first interpreter in which `probe` (Python source, e.g. "import torch") runs."""
    candidates = [os.environ.get("MF_BENCH_TORCH_PYTHON"), str(REFERENCE_VENV / "bin" / "python"), sys.executable]
    for python in candidates:
        if python and Path(python).exists():
            ok = subprocess.run([python, "-c", probe], capture_output=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
            if ok.returncode == 0:
                return python
    return None


def run_side(python: str, argv: list[str], label: str, env: dict | None = None) -> dict | None:
    """Run `python argv...` (a benchmark side in its own interpreter, with `env` added to this
    process's environment) and return the last JSON object it printed on stdout; None, after one
    line naming `label` and the side's last error line, when it failed or printed none."""
    proc = subprocess.run([python, *argv], capture_output=True, text=True,
                          env={**os.environ, "GLOG_v": "3", "PYTHONWARNINGS": "ignore", **(env or {})})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        print(f"{label} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
        return None
    return json.loads(lines[-1])
