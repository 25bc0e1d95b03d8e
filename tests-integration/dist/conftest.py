"""Helpers for the multi-process tests.

`dist_run(script, n, *args)` (session scope) runs a worker on n CPU ranks through
`mf_parallel.launch` once per distinct call and keeps every rank's log and RESULT lines, so many
test items share one launch (an msrun start-up costs ~20 s here). The launches of the session:

* world 4 (`_world4_worker.py`): the collectives checks, the 4-rank Trainer cases, the 4-rank
  context-parallel checks (`_cp_worker.py`), then the capability probes — one msrun start-up for
  every test file that reads it (`world4`, and `cp_world4` for the CP checks);
* world 2 (`_world2_worker.py`): the 2-rank Trainer cases, then the 2-rank context-parallel
  checks (`world2`; `cp_world2`); after world 4, whose EP4 checkpoint one of its cases continues;
* world 8 (`_trainer_worker.py`): the seed's parallelism example scaled down (`world8`);
* world 2 (`_pipeline_worker.py`): interleaved + dx/dw split + overlap flags, executor alone,
  against one process (fixture in test_pipeline_parity.py; the others are Trainer cases above);
* plus one-process reference runs of `_trainer_worker.py` (no msrun), the launcher tests, and the
  three two-node `mf launch` jobs of test_multinode.py (two network namespaces; after world 4,
  whose `fsdp2_tp2` case is the uninterrupted run they resume bit for bit).
"""

from __future__ import annotations

import io
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from _launches import (  # noqa: E402
    CP_WORLD2_CASES,
    CP_WORLD4_CASES,
    REFERENCES,
    TRAINER_WORKER,
    WORLD2_CASES,
    WORLD2_WORKER,
    WORLD4_CASES,
    WORLD4_WORKER,
    WORLD8_CASES,
    run_one_process,
    write_corpus,
    write_demo_corpus,
)
from _results import parse  # noqa: E402


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
def scratch():
    """A private directory for the session: pytest keeps only the newest three base directories
    per user, and other pytest runs on a shared machine could delete one while ranks write there."""
    root = Path(tempfile.mkdtemp(prefix="mf-dist-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


# Every launch of the session, for the time table at the end (the suite's budget is mostly these).
_LAUNCHES: list[tuple[str, int, DistRun]] = []
# A rank that died of a signal inside MindSpore's own kernels (seen once: a SIGSEGV in libnnacl.so's
# backend_queue thread during a 4-rank PyNative case that passed in every other run) ends a whole
# launch; such a launch is run once more, and the terminal summary says so. A rank that raised or
# exited with an error is never retried, nor is a crash that happens again.
_NATIVE_CRASH = re.compile(r"died without reporting an error \(killed by (SIG(SEGV|BUS|ILL|ABRT)|a signal or crashed "
                           r"in native code)")
_RETRIED: list[tuple[str, str]] = []
_CASE_TIME = re.compile(r"^CASE (\S+) rank 0 done in ([0-9.]+)s", re.MULTILINE)


def pytest_terminal_summary(terminalreporter):
    """Seconds per msrun launch and per Trainer case on rank 0: where the dist session's time goes."""
    if not _LAUNCHES:
        return
    terminalreporter.section("msrun launches")
    for script, crash in _RETRIED:
        terminalreporter.write_line(f"RETRIED {script}: its first launch ended with a native crash: {crash}")
    for script, n, run in _LAUNCHES:
        cases = ", ".join(f"{name} {float(sec):.0f}" for name, sec in _CASE_TIME.findall(run.logs[0] if run.logs else ""))
        terminalreporter.write_line(f"{script} on {n} ranks: {run.seconds:.0f} s" + (f" (cases: {cases})" if cases else ""))


@pytest.fixture(scope="session")
def dist_run(scratch):
    """`dist_run(script, n, *args)` -> DistRun, launched once per distinct call in the session."""
    from mf_parallel import launch

    cache: dict[tuple, DistRun] = {}

    def run(script: Path, n: int, *args: str, env: dict | None = None) -> DistRun:
        key = (str(script), n, args, tuple(sorted((env or {}).items())))
        if key not in cache:
            result = _launch_once(script, n, args, env)
            crash = _NATIVE_CRASH.search(result.console) if result.rc != 0 else None
            if crash:
                line = next(x for x in result.console.splitlines() if crash.group(0) in x)
                _RETRIED.append((Path(script).name, line.strip()))
                _forget_cases(args)
                result = _launch_once(script, n, args, env)
            cache[key] = result
            _LAUNCHES.append((Path(script).name, n, cache[key]))
        return cache[key]

    def _forget_cases(args: tuple) -> None:
        """Before a retry: the first launch's case outputs go (`<workdir>/<case>[_cont]`, the layout
        of _trainer_worker.config), else the retried cases find their own step-STEPS checkpoints
        and stop at once as finished runs."""
        workdir = Path(args[0]) if args and Path(args[0]).is_dir() else None
        if workdir is None:
            return
        for case in args[1:]:
            for name in (case, f"{case}_cont"):
                if name and not name.startswith("-") and (workdir / name).is_dir():
                    shutil.rmtree(workdir / name)

    def _launch_once(script: Path, n: int, args: tuple, env: dict | None) -> DistRun:
        log_dir = Path(tempfile.mkdtemp(prefix=Path(script).stem + "-", dir=scratch))
        console = io.StringIO()
        start = time.monotonic()
        rc = launch(n, [str(script), *args], log_dir, console=console, env={**os.environ, **(env or {})},
                    cwd=log_dir)
        logs = [(log_dir / f"worker_{r}.log").read_text(errors="replace")
                if (log_dir / f"worker_{r}.log").exists() else "" for r in range(n)]
        return DistRun(rc, console.getvalue(), logs, time.monotonic() - start)

    return run


@pytest.fixture(scope="session")
def trainer_workdir(scratch):
    workdir = scratch / "trainer"
    write_corpus(workdir / "data" / "toy_text_document")
    write_demo_corpus(workdir / "demo_cache")
    return workdir


@pytest.fixture(scope="session")
def reference(trainer_workdir):
    """The one-process runs (the 2-layer model, and the 4- and 6-layer models of the pipeline
    cases, and Muon): _trainer_worker.STEPS (4) steps, a checkpoint at the last, and MORE (2) more
    steps resumed from it."""
    proc = run_one_process(trainer_workdir, *REFERENCES)
    if proc.returncode != 0:
        pytest.fail(f"reference run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return trainer_workdir


@pytest.fixture(scope="session")
def world4(dist_run, reference):
    result = dist_run(WORLD4_WORKER, 4, str(reference), *WORLD4_CASES, "--cp", *CP_WORLD4_CASES)
    if result.rc != 0 or len(result.by_name("done")) != 4:
        pytest.fail(result.failure_report())
    return result


@pytest.fixture(scope="session")
def world2(dist_run, reference, world4):
    """After world4: `moe_ep2_from_moe_ep4_deredundancy` continues the EP4 checkpoint written there."""
    result = dist_run(WORLD2_WORKER, 2, str(reference), *WORLD2_CASES, "--cp", *CP_WORLD2_CASES, "--prefetch")
    if result.rc != 0:
        pytest.fail(result.failure_report())
    return result


@pytest.fixture(scope="session")
def world8(dist_run, reference):
    """8 ranks on this machine's 2 cores: one case, few steps (_trainer_worker.SHORT)."""
    result = dist_run(TRAINER_WORKER, 8, str(reference), *WORLD8_CASES)
    done = sum(all(f"CASE {case} rank" in log for case in WORLD8_CASES) for log in result.logs)
    if result.rc != 0 or done != 8:
        pytest.fail(result.failure_report())
    return result


def _cp_checks(result: DistRun, world: int) -> DistRun:
    """The launch's context-parallel part ran on every rank."""
    if len(result.by_name("cp_done")) != world:
        pytest.fail("the context-parallel checks did not finish on every rank\n" + result.failure_report())
    return result


@pytest.fixture(scope="session")
def cp_world2(world2):
    return _cp_checks(world2, 2)


@pytest.fixture(scope="session")
def cp_world4(world4):
    return _cp_checks(world4, 4)
