"""Helpers for the multi-process tests: run a script on N CPU ranks under msrun."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest


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
