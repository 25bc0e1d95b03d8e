"""mf_trainer.memory_plan's estimate against the measured peak of the real Trainer, per setting.

    python benchmarks/memory_bench.py [CASE ...]     # default: idle none full select (one process each)

Each case is `tests-integration/memory/_memory_worker.py` in its own process (a llama of hidden 256,
4 layers, vocabulary 2000, 8 sequences of 256 tokens, PyNative, 2 steps; `idle` the same run
with a minuscule model). Measured = the case's peak RSS (VmHWM) minus the idle run's: the
framework's own footprint taken out. Recompute settings are also compared with `none` run in the
same session: the bytes each one saves, estimated against measured.

Output lines: `name: ours X, reference Y, ratio Z` (ours = the estimate, reference = measured).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests-integration" / "memory" / "_memory_worker.py"
MIB = 1 << 20


def run_case(workdir: Path, name: str) -> dict:
    env = {**os.environ, "GLOG_v": "3"}
    for key in ("MS_WORKER_NUM", "RANK_SIZE", "WORLD_SIZE"):
        env.pop(key, None)
    proc = subprocess.run([sys.executable, str(WORKER), str(workdir), name], capture_output=True, text=True,
                          env=env, timeout=1800)
    if proc.returncode:
        raise SystemExit(f"memory_bench: case {name} failed:\n{proc.stderr[-3000:]}")
    return json.loads((workdir / name / "rank_0.json").read_text())


def main(cases: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="mf-memory-bench-") as tmp:
        workdir = Path(tmp)
        results = {name: run_case(workdir, name) for name in ["idle", *[c for c in cases if c != "idle"]]}
    idle = results["idle"]["peak"]
    print(f"idle rank baseline (framework, loader, minuscule model): {idle / MIB:.1f} MiB")
    for name, r in results.items():
        if name == "idle":
            continue
        measured = r["peak"] - idle
        parts = ", ".join(f"{k} {v / MIB:.1f}" for k, v in r["parts"].items())
        print(f"memory {name}: ours {r['estimate'] / MIB:.1f} MiB, reference {measured / MIB:.1f} MiB, "
              f"ratio {r['estimate'] / measured:.3f}   ({parts} MiB)")
    if "none" in results:
        base = results["none"]
        for name, r in results.items():
            if name in ("idle", "none"):
                continue
            est, got = base["estimate"] - r["estimate"], base["peak"] - r["peak"]
            if got > 0:
                print(f"saved by recompute {name} against none: ours {est / MIB:.1f} MiB, reference {got / MIB:.1f} "
                      f"MiB, ratio {est / got:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["idle", "none", "full", "select"])
