"""Sharded tensors and the threaded collective simulator."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from mf_ckpt import (
    RankFailed,
    ShardedTensor,
    SingleProcess,
    ThreadedWorld,
    exchange_bytes,
    replicated,
    run_threaded,
    shard_array,
    split_evenly,
    split_padded,
    split_sizes,
)


def test_split_sizes_match_numpy_array_split():
    for n in (0, 1, 7, 10, 64):
        for parts in (1, 3, 4, 8):
            assert split_sizes(n, parts) == [len(a) for a in np.array_split(np.arange(n), parts)]


def test_even_split_offsets_and_validation():
    g = np.arange(10 * 4).reshape(10, 4)
    pieces = [shard_array(g, 0, r, 3) for r in range(3)]
    assert [p.global_offset for p in pieces] == [(0, 0), (4, 0), (7, 0)]
    assert np.array_equal(np.concatenate([p.chunk for p in pieces]), g)
    with pytest.raises(ValueError, match="rank 1 should hold 3 along axis 0, has 4"):
        split_evenly(np.zeros((4, 4)), (10, 4), 0, 1, 3)
    with pytest.raises(ValueError, match="axis 1 is not split"):
        split_evenly(np.zeros((4, 3)), (10, 4), 0, 0, 3)


def test_padded_split_excludes_padding_from_the_chunk():
    g = np.arange(10, dtype=np.float32) + 1
    pieces = [shard_array(g, 0, r, 4, padded=True) for r in range(4)]
    assert all(p.data.shape == (3,) for p in pieces)
    assert [p.chunk_shape for p in pieces] == [(3,), (3,), (3,), (1,)]
    assert pieces[3].data.tolist() == [10, 0, 0]  # zero padding after the last real row
    assert np.array_equal(np.concatenate([p.chunk for p in pieces]), g)
    # With 2 rows over 4 ranks the last ranks hold only padding: empty chunks.
    tail = shard_array(np.ones(2), 0, 3, 4, padded=True)
    assert tail.chunk_shape == (0,) and tail.is_empty
    with pytest.raises(ValueError, match="padded split of 10 over 4"):
        split_padded(np.zeros(2), (10,), 0, 0, 4)


def test_two_axis_split():
    g = np.arange(6 * 8).reshape(6, 8)
    pieces = [shard_array(g, (0, 1), (r // 2, r % 2), (3, 2)) for r in range(6)]
    assert pieces[3].global_offset == (2, 4) and pieces[3].chunk_shape == (2, 4)
    rebuilt = np.zeros_like(g)
    for p in pieces:
        o = p.global_offset
        rebuilt[o[0]:o[0] + 2, o[1]:o[1] + 4] = p.data
    assert np.array_equal(rebuilt, g)


def test_sharded_tensor_checks_its_arguments():
    with pytest.raises(ValueError, match="dims"):
        ShardedTensor(np.zeros((2, 2)), (4,), (0,))
    with pytest.raises(ValueError, match="replica_id"):
        replicated(np.zeros(3), replica_id=-1)
    with pytest.raises(TypeError):
        ShardedTensor([1, 2], (2,))


def test_threaded_all_gather_and_exchange():
    def body(comm):
        got = comm.all_gather_object({"rank": comm.rank})
        out = {dst: f"{comm.rank}->{dst}".encode() for dst in range(comm.world_size) if dst != comm.rank}
        inbox = comm.exchange_bytes(out)
        comm.barrier()
        return got, inbox

    results = run_threaded(3, body)
    assert results[1][0] == [{"rank": 0}, {"rank": 1}, {"rank": 2}]
    assert results[2][1] == {0: b"0->2", 1: b"1->2"}


def test_objects_cross_ranks_as_copies():
    shared = {"x": [1]}

    def body(comm):
        got = comm.all_gather_object(shared)
        got[0]["x"].append(comm.rank)  # must not leak into other ranks' view
        comm.barrier()
        return got[0]["x"]

    assert run_threaded(2, body) == [[1, 0], [1, 1]]


def test_exchange_falls_back_to_all_gather():
    class GatherOnly:
        def __init__(self, comm):
            self.rank, self.world_size, self._c = comm.rank, comm.world_size, comm

        def all_gather_object(self, obj):
            return self._c.all_gather_object(obj)

        def barrier(self):
            self._c.barrier()

    results = run_threaded(3, lambda c: exchange_bytes(GatherOnly(c), {(c.rank + 1) % 3: bytes([c.rank])}))
    assert results == [{2: b"\x02"}, {0: b"\x00"}, {1: b"\x01"}]
    assert exchange_bytes(SingleProcess(), {0: b"x"}) == {0: b"x"}


def test_a_failing_rank_releases_the_others():
    started = threading.Event()

    def body(comm):
        if comm.rank == 1:
            started.wait(5)
            raise KeyError("boom on rank 1")
        started.set()
        comm.barrier()  # would hang forever without the abort

    with pytest.raises(KeyError, match="boom on rank 1"):
        ThreadedWorld(3, timeout=30).run(body)
    with pytest.raises(RankFailed):
        ThreadedWorld(2, timeout=0.2).run(lambda c: c.barrier() if c.rank == 0 else None)
