"""`mf_parallel.launch` ends a job promptly when one rank raises, shows that rank's error and
traceback and exits non-zero; rank 0's output is streamed while the job runs. (A rank killed by a
signal is tested through `mf launch` and the real Trainer: test_mf_launch.py.)"""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

from mf_parallel import launch

WORKER = Path(__file__).with_name("_failing_worker.py")
# msrun start-up takes ~20 s on this machine; a hung job would run until the test's own timeout.
PROMPT_SECONDS = 120


@pytest.mark.parametrize("how, expected", [
    ("raise", "mf launch: rank 1 failed: RuntimeError: rank 1 exploded at step 3"),
])
def test_failing_rank_ends_the_job(tmp_path, how, expected):
    console = io.StringIO()
    start = time.monotonic()
    rc = launch(2, [str(WORKER), how], tmp_path / "logs", console=console, cwd=tmp_path)
    seconds = time.monotonic() - start
    text = console.getvalue()
    assert rc != 0
    assert expected in text, text[-3000:]
    if how == "kill":
        assert "died without reporting an error" in text
    else:
        assert "Traceback" in text                     # the failing rank's log tail is shown
    assert "rank 0 step 1" in text                     # rank 0 was streamed while it ran
    assert "stopped all ranks" in text
    assert seconds < PROMPT_SECONDS, f"took {seconds:.0f}s"
    assert not list((tmp_path / "logs" / ".status").glob("rank_0.done"))
