"""async_save (snapshot, background write, commit, failures) and save_max rotation."""

from __future__ import annotations

import errno
import json
import os
import threading
import time

import numpy as np
import pytest

import mf_ckpt.saver as save_module
from mf_ckpt import CheckpointError, SaveOptions, Saver, load, replicated, run_threaded, shard_array


def marker(path) -> str | None:
    f = path / "latest_checkpointed_iteration.txt"
    return f.read_text().strip() if f.exists() else None


def iterations(path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.name.startswith("iteration_"))


def test_async_save_snapshots_then_commits_on_wait(tmp_path, monkeypatch):
    gate = threading.Event()
    real = save_module.write_file

    def slow_write(*args, **kwargs):
        gate.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(save_module, "write_file", slow_write)
    w = np.arange(8, dtype=np.float32)
    saver = Saver(SaveOptions(save_path=str(tmp_path), async_save=True))
    result = saver.save(3, {"w": w}, common={"step": 3})
    assert not result.committed and marker(tmp_path) is None
    w += 100  # training goes on and updates its buffers: the snapshot must not see it
    assert saver.poll() is False  # still writing
    gate.set()
    done = saver.wait()
    assert done.committed and done.path == tmp_path / "iteration_00000003" and marker(tmp_path) == "3"
    out = {"w": np.zeros(8, np.float32)}
    load(str(tmp_path), out)
    np.testing.assert_array_equal(out["w"], np.arange(8, dtype=np.float32))
    saver.finalize()


def test_async_failure_is_reported_on_every_rank_and_not_committed(tmp_path, monkeypatch):
    real = save_module.write_file

    def failing(path, *args, **kwargs):
        if "-0000001-" in path.name and "iteration_00000002" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(save_module, "write_file", failing)

    def body(comm):
        saver = Saver(SaveOptions(save_path=str(tmp_path), async_save=True), comm)
        st = {"w": shard_array(np.arange(10.0), 0, comm.rank, 2)}
        saver.save(1, st)
        saver.save(2, st)  # commits 1, starts 2 (which fails on rank 1 in the background)
        with pytest.raises(CheckpointError, match=r"saving iteration 2 .* failed on rank 1: .*No space left on device"):
            saver.save(3, st)  # the failure surfaces on the next call, on every rank
        saver.save(4, st)
        return saver.finalize().iteration

    assert run_threaded(2, body) == [4, 4]
    assert marker(tmp_path) == "4" and "iteration_00000002" not in iterations(tmp_path)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_poll_commits_when_every_rank_is_done(tmp_path):
    def body(comm):
        saver = Saver(SaveOptions(save_path=str(tmp_path), async_save=True), comm)
        saver.save(5, {"w": replicated(np.ones(4), replica_id=comm.rank)})
        deadline = time.time() + 20
        while not saver.poll():  # collective: every rank polls in lockstep, like a training loop
            assert time.time() < deadline
            time.sleep(0.01)
        assert saver.poll() is True  # nothing pending any more
        saver.finalize()
        return marker(tmp_path)

    assert run_threaded(3, body) == ["5"] * 3


def test_context_manager_finalizes(tmp_path):
    with Saver(SaveOptions(save_path=str(tmp_path), async_save=True)) as saver:
        saver.save(1, {"w": np.ones(3)})
    assert marker(tmp_path) == "1"


def test_save_max_keeps_the_newest(tmp_path):
    saver = Saver(SaveOptions(save_path=str(tmp_path), save_max=2))
    deleted = [saver.save(i, {"w": np.full(3, i, np.float32)}).deleted for i in (10, 20, 30, 40)]
    assert deleted == [[], [], [10], [20]]
    assert iterations(tmp_path) == ["iteration_00000030", "iteration_00000040"] and marker(tmp_path) == "40"


def test_rotation_keeps_the_resumed_run_not_stale_higher_iterations(tmp_path):
    saver = Saver(SaveOptions(save_path=str(tmp_path), save_max=2))
    for i in (10, 20, 30):
        saver.save(i, {"w": np.full(3, i, np.float32)})
    # A resumed run saves iteration 25: the stale 30 (older commit) goes before 25 does.
    assert saver.save(25, {"w": np.zeros(3, np.float32)}).deleted == [20]
    assert saver.save(26, {"w": np.zeros(3, np.float32)}).deleted == [30]
    assert iterations(tmp_path) == ["iteration_00000025", "iteration_00000026"] and marker(tmp_path) == "26"


def test_resaving_the_committed_iteration_replaces_it_safely(tmp_path):
    saver = Saver(SaveOptions(save_path=str(tmp_path), save_max=1))
    saver.save(7, {"w": np.zeros(3, np.float32)})
    saver.save(7, {"w": np.ones(3, np.float32)})
    out = {"w": np.zeros(3, np.float32)}
    load(str(tmp_path), out)
    assert (out["w"] == 1).all() and iterations(tmp_path) == ["iteration_00000007"]
    # If a crash hit between moving the old copy aside and putting the new one in place, the
    # loader finds the old copy under its `.replaced` name.
    os.replace(tmp_path / "iteration_00000007", tmp_path / ".iteration_00000007.replaced")
    load(str(tmp_path), out)
    assert (out["w"] == 1).all()


def test_stale_staging_directories_are_cleaned_and_ignored(tmp_path):
    stale = tmp_path / ".iteration_00000009.deadbeef.incomplete"
    stale.mkdir(parents=True)
    (stale / "metadata.json").write_text("{}")
    saver = Saver(SaveOptions(save_path=str(tmp_path)))
    saver.save(1, {"w": np.ones(2)})
    assert not stale.exists() and iterations(tmp_path) == ["iteration_00000001"]
    common = json.loads((tmp_path / "iteration_00000001" / "common.json").read_text())
    assert common["iteration"] == 1
