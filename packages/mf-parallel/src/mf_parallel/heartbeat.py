"""A rank's heartbeat under `mf_parallel.launch`: proof of life the launcher's watchdog reads.

    beat = start_heartbeat(600, "training.hang_timeout_s")   # after joining the world; None outside a launch
    beat.at(step, "training")                  # where the rank is: named if it goes silent

A daemon thread rewrites `<status dir>/rank_<r>.heartbeat` (JSON: rank, pid, step, phase, time,
timeout) every second, atomically. The thread runs while the main thread waits in a collective
(MindSpore releases the interpreter there: measured on 2.10.0 CPU, a rank blocked 30 s in an
all-reduce kept beating), so a silent heartbeat means the process itself stopped running Python:
stopped (SIGSTOP, a debugger), frozen in I/O (a dead network mount) or stuck in native code that
holds the interpreter. The launcher ends the job when a live rank has been silent longer than the
timeout the rank declared (mf: `training.hang_timeout_s`), naming the rank and its step
(watchdog.py). Ranks that are merely waiting for a silent peer keep beating and are not blamed.

One heartbeat per process: a second `start_heartbeat` (another Trainer in the same process)
returns the same one with the new timeout. Nothing here imports MindSpore.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

INTERVAL_S = 1.0
_LOCK = threading.Lock()
_CURRENT: list[Heartbeat] = []


def heartbeat_name(rank: int | str) -> str:
    return f"rank_{rank}.heartbeat"


def _launch_rank() -> int | None:
    """This worker's global rank as msrun exports it; None in msrun's scheduler process."""
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        return None
    for key in ("RANK_ID", "MS_NODE_ID", "RANK"):
        value = os.environ.get(key, "")
        if value.isdigit():
            return int(value)
    return None


class Heartbeat:
    """Rewrites `path` every `interval` seconds from a daemon thread until `stop()`."""

    def __init__(self, path: Path, rank: int, timeout_s: float, setting: str = "timeout",
                 interval: float = INTERVAL_S) -> None:
        self.path, self.rank, self.timeout_s, self.interval = Path(path), rank, float(timeout_s), interval
        self.setting = setting
        self.step, self.phase = 0, "starting"
        self._stop = threading.Event()
        self._write()                  # visible before the first interval
        self._thread = threading.Thread(target=self._run, name="mf-heartbeat", daemon=True)
        self._thread.start()

    def at(self, step: int, phase: str = "training") -> None:
        """Record where the rank is (the step it is running or has just run, and what it does)."""
        self.step, self.phase = int(step), phase

    def _write(self) -> None:
        record = {"rank": self.rank, "pid": os.getpid(), "step": self.step, "phase": self.phase,
                  "time": time.time(), "timeout": self.timeout_s, "setting": self.setting, "interval": self.interval}
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(record))
            os.replace(tmp, self.path)        # the launcher never reads half a record
        except OSError:
            pass    # a full or vanished status directory must not kill training; the watchdog then sees silence

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._write()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * self.interval)


STATUS_ENV = "MF_LAUNCH_STATUS_DIR"     # set by the launcher for every rank it starts


def watched_by_launcher() -> bool:
    """Whether this process was started by `mf_parallel.launch` (whose watchdog reads heartbeats)."""
    return bool(os.environ.get(STATUS_ENV))


def start_heartbeat(timeout_s: float, setting: str = "timeout",
                    status_dir: str | os.PathLike | None = None) -> Heartbeat | None:
    """This process's heartbeat, started once: under `launch` (status directory in
    MF_LAUNCH_STATUS_DIR, rank from msrun's environment) or with an explicit `status_dir`. None
    where no launcher watches (a plain process, msrun's scheduler process). `setting` names where
    the timeout came from, for the watchdog's message (e.g. "training.hang_timeout_s")."""
    if not (isinstance(timeout_s, (int, float)) and not isinstance(timeout_s, bool) and timeout_s > 0):
        raise ValueError(f"heartbeat timeout must be a positive number of seconds, got {timeout_s!r}")
    where = status_dir if status_dir is not None else os.environ.get(STATUS_ENV)
    rank = _launch_rank()
    if not where or rank is None or not Path(where).is_dir():
        return None
    with _LOCK:
        if _CURRENT:
            _CURRENT[0].timeout_s, _CURRENT[0].setting = float(timeout_s), setting
            return _CURRENT[0]
        beat = Heartbeat(Path(where) / heartbeat_name(rank), rank, timeout_s, setting)
        _CURRENT.append(beat)
        return beat
