"""The launcher's hang watchdog: which rank of this node went silent (heartbeat.py writes the beats).

A rank is hung when its process is alive, it has not finished, and its heartbeat file is older
than the timeout the rank declared (with the setting it came from: mf's
`training.hang_timeout_s`). Ranks without a heartbeat file (a script that never started one, a
rank still importing) are not judged: msrun's cluster time-out covers the start-up. The verdict
names the rank, the step and phase its last beat recorded, how long it has been silent and, when
/proc tells, what its process is doing:

    rank 3 hung at step 5 (training): no heartbeat for 12 s (training.hang_timeout_s = 10); its process 4711 is stopped (SIGSTOP or job control)

Of several silent ranks the one silent longest is named (the others may be its victims).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Beat:
    rank: str
    pid: int
    step: int
    phase: str
    time: float
    timeout: float
    setting: str = "timeout"


def read_beats(status: Path) -> dict[str, Beat]:
    """{rank: its last beat} from `rank_<r>.heartbeat` files (unreadable ones are skipped: a beat
    is rewritten every second, the next read sees it)."""
    beats = {}
    for path in status.glob("rank_*.heartbeat"):
        try:
            raw = json.loads(path.read_text())
            beat = Beat(str(raw["rank"]), int(raw["pid"]), int(raw["step"]), str(raw["phase"]), float(raw["time"]),
                        float(raw["timeout"]), str(raw.get("setting", "timeout")))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        beats[beat.rank] = beat
    return beats


_STATES = {"T": "is stopped (SIGSTOP or job control)", "t": "is stopped by a debugger",
           "D": "is blocked in uninterruptible I/O (a hung file system?)"}


def process_state(pid: int) -> str:
    """What /proc says the process is doing, as words ('' when it cannot tell)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return ""
    return _STATES.get(state, "is alive but not running Python (stuck in native code?)" if state in "RS" else "")


def silent_rank(status: Path, alive: Callable[[int], bool], now: float | None = None) -> str | None:
    """The one-line verdict on this node's longest-silent live rank past its timeout, or None."""
    now = time.time() if now is None else now
    worst = None
    for rank, beat in read_beats(status).items():
        if (status / f"rank_{rank}.done").exists() or (status / f"rank_{rank}.failed").exists():
            continue
        silence = now - beat.time
        if silence > beat.timeout and alive(beat.pid) and (worst is None or silence > worst[0]):
            worst = (silence, beat)
    if worst is None:
        return None
    silence, beat = worst
    state = process_state(beat.pid)
    return (f"rank {beat.rank} hung at step {beat.step} ({beat.phase}): no heartbeat for {silence:.0f} s "
            f"({beat.setting} = {beat.timeout:g})" + (f"; its process {beat.pid} {state}" if state else ""))
