"""Helpers for the multi-process tests: run a script on N CPU ranks under msrun.

`msrun` (function scope) runs msrun directly, as before. `dist_run` (session scope) runs a worker
through `mf_parallel.launch` once per (script, ranks, args) and caches the parsed RESULT lines of
every rank, so many test items share one ~20 s launch.
"""

from __future__ import annotations

import io
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from _results import parse  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def msrun(tmp_path: Path):
    """Run `script args...` on `n` ranks; returns the per-rank log texts. Fails with rank logs shown."""
    exe = shutil.which("msrun")
    if exe is None:
        pytest.fail("msrun not on PATH: the dist session must run inside a venv with MindSpore")

    def run(script: Path, n: int, *args: str, timeout: float = 300) -> list[str]:
        log_dir = tmp_path / "msrun_logs"
        cmd = [exe, f"--worker_num={n}", f"--local_worker_num={n}", f"--master_port={_free_port()}",
               f"--log_dir={log_dir}", "--join=True", str(script), *args]
        env = {**os.environ, "GLOG_v": "3"}
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)
        logs = [(log_dir / f"worker_{r}.log").read_text() if (log_dir / f"worker_{r}.log").exists() else ""
                for r in range(n)]
        if proc.returncode != 0:
            tails = "\n".join(f"--- rank {r} ---\n{log[-3000:]}" for r, log in enumerate(logs))
            pytest.fail(f"msrun exited {proc.returncode}\n{proc.stderr[-2000:]}\n{tails}")
        return logs

    return run


class DistRun:
    """One launch: return code, console text (rank 0 streamed), per-rank logs and RESULT records."""

    def __init__(self, rc: int, console: str, logs: list[str], seconds: float) -> None:
        self.rc, self.console, self.logs, self.seconds = rc, console, logs, seconds
        self.results = [dict(r, rank=rank) for rank, log in enumerate(logs) for r in parse(log)]

    def by_name(self, name: str) -> list[dict]:
        return [r for r in self.results if r["name"] == name]

    def failure_report(self) -> str:
        tails = "\n".join(f"--- rank {r} ---\n{log[-4000:]}" for r, log in enumerate(self.logs))
        return f"launch returned {self.rc}\n{self.console[-3000:]}\n{tails}"


@pytest.fixture(scope="session")
def dist_run():
    """`dist_run(script, n, *args)` -> DistRun, launched once per distinct call in the session.

    Logs go to a private temporary directory, not pytest's tmp_path_factory: pytest keeps only the
    newest three base directories per user, and other pytest runs on a shared machine would delete
    a launch's directory while its ranks still write there.
    """
    from mf_parallel import launch

    cache: dict[tuple, DistRun] = {}
    root = Path(tempfile.mkdtemp(prefix="mf-dist-"))

    def run(script: Path, n: int, *args: str, env: dict | None = None) -> DistRun:
        key = (str(script), n, args, tuple(sorted((env or {}).items())))
        if key not in cache:
            log_dir = Path(tempfile.mkdtemp(prefix=Path(script).stem + "-", dir=root))
            console = io.StringIO()
            start = time.monotonic()
            rc = launch(n, [str(script), *args], log_dir, console=console, env={**os.environ, **(env or {})},
                        cwd=log_dir)
            logs = [(log_dir / f"worker_{r}.log").read_text(errors="replace")
                    if (log_dir / f"worker_{r}.log").exists() else "" for r in range(n)]
            cache[key] = DistRun(rc, console.getvalue(), logs, time.monotonic() - start)
        return cache[key]

    yield run
    shutil.rmtree(root, ignore_errors=True)
