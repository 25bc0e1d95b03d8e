"""The hang watchdog's pieces without msrun: a rank's heartbeat file, the verdict on a silent rank,
and the launchers' link between nodes (hub and spokes over localhost)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mf_parallel import ParallelConfigError, start_heartbeat
from mf_parallel.heartbeat import Heartbeat
from mf_parallel.launcher import _open_link
from mf_parallel.nodelink import Hub, Spoke, ranks_text
from mf_parallel.watchdog import read_beats, silent_rank


def _beat_file(status: Path, rank: int, pid: int, step: int, age: float, timeout: float = 10.0) -> None:
    record = {"rank": rank, "pid": pid, "step": step, "phase": "training", "time": time.time() - age,
              "timeout": timeout, "setting": "training.hang_timeout_s"}
    (status / f"rank_{rank}.heartbeat").write_text(json.dumps(record))


def test_a_heartbeat_rewrites_its_file_with_the_step_it_is_at(tmp_path):
    beat = Heartbeat(tmp_path / "rank_3.heartbeat", 3, 42.0, "training.hang_timeout_s", interval=0.05)
    try:
        first = json.loads((tmp_path / "rank_3.heartbeat").read_text())     # written at once
        assert first["rank"] == 3 and first["pid"] == os.getpid() and first["timeout"] == 42.0
        beat.at(7, "saving a checkpoint")
        time.sleep(0.3)
        later = read_beats(tmp_path)["3"]
        assert (later.step, later.phase, later.setting) == (7, "saving a checkpoint", "training.hang_timeout_s")
        assert later.time > first["time"]
    finally:
        beat.stop()
    assert not list(tmp_path.glob("*.tmp"))


def test_no_heartbeat_where_no_launcher_watches(tmp_path, monkeypatch):
    monkeypatch.delenv("MF_LAUNCH_STATUS_DIR", raising=False)
    monkeypatch.setenv("RANK_ID", "0")
    assert start_heartbeat(600) is None                              # a plain process
    monkeypatch.setenv("MF_LAUNCH_STATUS_DIR", str(tmp_path))
    monkeypatch.setenv("MS_ROLE", "MS_SCHED")
    assert start_heartbeat(600) is None                              # msrun's scheduler runs the same script
    assert not list(tmp_path.iterdir())
    with pytest.raises(ValueError, match="positive number of seconds, got 0"):
        start_heartbeat(0)


def test_a_launched_rank_beats_once_per_process(tmp_path):
    code = ("import time\nfrom mf_parallel import start_heartbeat\n"
            "a = start_heartbeat(30, 'training.hang_timeout_s'); b = start_heartbeat(5, 'x')\n"
            "assert a is b and a.timeout_s == 5; a.at(2); time.sleep(1.3)\n")
    env = {**os.environ, "MF_LAUNCH_STATUS_DIR": str(tmp_path), "RANK_ID": "1"}
    env.pop("MS_ROLE", None)
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    beat = read_beats(tmp_path)["1"]
    assert (beat.step, beat.timeout, beat.setting) == (2, 5.0, "x")


def test_the_silent_live_rank_is_named_with_its_step_and_state(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    waiting = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        alive = lambda pid: sleeper.poll() is None if pid == sleeper.pid else waiting.poll() is None  # noqa: E731
        _beat_file(tmp_path, 0, waiting.pid, 5, age=0.5)                # waits in a collective, still beating
        _beat_file(tmp_path, 2, sleeper.pid, 5, age=3)
        assert silent_rank(tmp_path, alive) is None                     # 3 s of a 10 s timeout
        _beat_file(tmp_path, 2, sleeper.pid, 5, age=12)
        os.kill(sleeper.pid, signal.SIGSTOP)
        time.sleep(0.2)
        verdict = silent_rank(tmp_path, alive)
        assert verdict.startswith("rank 2 hung at step 5 (training): no heartbeat for 12 s "
                                  "(training.hang_timeout_s = 10); its process"), verdict
        assert verdict.endswith("is stopped (SIGSTOP or job control)"), verdict
        (tmp_path / "rank_2.done").write_text("ok\n")                   # a finished rank is never hung
        assert silent_rank(tmp_path, alive) is None
        (tmp_path / "rank_2.done").unlink()
        os.kill(sleeper.pid, signal.SIGKILL)
        sleeper.wait()
        assert silent_rank(tmp_path, alive) is None                     # a dead one is the vanished-rank check's
    finally:
        for proc in (sleeper, waiting):
            proc.kill()
            proc.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _until(poll, kinds=("lost", "failed", "stop", "done"), timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = [e for e in poll() if e.kind in kinds]
        if events:
            return events
        time.sleep(0.05)
    return []


def _linked(port: int, nodes: int = 2):
    hub = Hub(port, nodes, [0, 1], join_timeout=30)
    spokes = [Spoke("127.0.0.1", port, n, [2 * n, 2 * n + 1], join_timeout=30) for n in range(1, nodes)]
    deadline = time.monotonic() + 10
    while len(hub.peers) < nodes - 1 and time.monotonic() < deadline:
        for spoke in spokes:
            spoke.poll({})
        hub.poll()
        time.sleep(0.05)
    assert len(hub.peers) == nodes - 1
    return hub, spokes


def test_a_spoke_that_vanishes_is_a_lost_node_with_its_ranks_and_step():
    port = _free_port()
    hub, (spoke,) = _linked(port)
    try:
        for _ in range(3):
            spoke.last_beat = 0.0
            spoke.poll({"2": 6, "3": 5})
            hub.poll()
        spoke.close()                                   # what SIGKILL of its launcher does
        (event,) = _until(hub.poll)
        assert (event.kind, event.node) == ("lost", 1)
        assert event.text == ("node 1 (ranks 2-3) lost at step 6: the connection to its launcher closed (its machine "
                              "or its processes died)")
        assert hub.all_finished()
    finally:
        hub.close()


def test_a_spoke_failure_reaches_the_hub_and_the_hub_stops_the_others():
    port = _free_port()
    hub, (one, two) = _linked(port, nodes=3)
    try:
        one.report({"failed": "rank 2 hung at step 3 (training): ...", "code": 1})
        (event,) = _until(hub.poll)
        assert (event.kind, event.node, event.text, event.code) == ("failed", 1, "rank 2 hung at step 3 (training): ...", 1)
        hub.tell({"stop": "node 1: rank 2 hung at step 3 (training): ...", "code": 1})
        (stop,) = _until(lambda: two.poll({}))
        assert (stop.kind, stop.text, stop.code) == ("stop", "node 1: rank 2 hung at step 3 (training): ...", 1)
    finally:
        hub.close()
        one.close()
        two.close()


def test_node_0_finishing_is_not_a_loss_but_vanishing_is():
    port = _free_port()
    hub, (spoke,) = _linked(port)
    hub.tell({"done": True})
    hub.close()
    assert _until(lambda: spoke.poll({}), timeout=1.5) == []
    spoke.close()

    hub, (spoke,) = _linked(port)
    hub.close()
    (event,) = _until(lambda: spoke.poll({}))
    assert event.kind == "lost" and event.text.startswith("node 0 (ranks 0-1) lost: the connection to its launcher")
    spoke.close()


def test_a_spoke_done_then_gone_is_finished():
    port = _free_port()
    hub, (spoke,) = _linked(port)
    try:
        spoke.report({"done": True})
        spoke.close()
        assert [e.kind for e in _until(hub.poll)] == ["done"]
        assert hub.all_finished() and _until(hub.poll, timeout=0.5) == []
    finally:
        hub.close()


def test_a_node_that_never_joins_is_lost_after_the_join_timeout():
    hub = Hub(_free_port(), 2, [0, 1], join_timeout=0.3)
    try:
        (event,) = _until(hub.poll)
        assert event.text.startswith("node 1 lost: its launcher did not connect within 0 s")
    finally:
        hub.close()
    spoke = Spoke("127.0.0.1", _free_port(), 1, [2, 3], join_timeout=0.3)
    (event,) = _until(lambda: spoke.poll({}))
    assert event.text.startswith("node 0 lost: its launcher at 127.0.0.1:") and "did not answer within 0 s" in event.text


def test_a_taken_link_port_is_one_line():
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(ParallelConfigError, match=rf"--master-port {port - 1}: node 0 also needs port {port} for the "
                                                      "launchers' link, and it is not free here"):
            _open_link(2, 0, 2, "127.0.0.1", port - 1, 30)


def test_ranks_text():
    assert ranks_text([2, 3]) == "ranks 2-3" and ranks_text([5]) == "rank 5" and ranks_text([1, 4]) == "ranks 1, 4"
