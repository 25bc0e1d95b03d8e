"""The small collective interface save/load need, a single-process implementation and a simulator.

mf-parallel implements `Collective` over MindSpore; mf-ckpt ships `SingleProcess` for tools and
`ThreadedWorld`, N ranks as threads of one process, for tests and benchmarks. Objects cross ranks
pickled, as they would between processes, so a test cannot rely on shared mutable state.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar, runtime_checkable

T = TypeVar("T")


@runtime_checkable
class Collective(Protocol):
    """What mf-ckpt needs from a distributed runtime. All ranks call each method in the same order.

    `exchange_bytes` is optional: without it, `exchange_bytes(comm, ...)` below falls back to
    `all_gather_object` (correct, but every rank then receives every buffer).
    """

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def all_gather_object(self, obj: Any) -> list[Any]: ...

    def barrier(self) -> None: ...


def exchange_bytes(comm: Collective, outgoing: Mapping[int, bytes]) -> dict[int, bytes]:
    """Send `outgoing[dst]` to each rank dst; returns {src: bytes received from src}."""
    native = getattr(comm, "exchange_bytes", None)
    if native is not None:
        return native(outgoing)
    gathered = comm.all_gather_object({int(dst): bytes(buf) for dst, buf in outgoing.items()})
    return {src: sent[comm.rank] for src, sent in enumerate(gathered) if comm.rank in sent}


class SingleProcess:
    """World of one: every collective is trivial."""

    rank = 0
    world_size = 1

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [pickle.loads(pickle.dumps(obj))]

    def barrier(self) -> None:
        pass

    def exchange_bytes(self, outgoing: Mapping[int, bytes]) -> dict[int, bytes]:
        return {0: bytes(outgoing[0])} if 0 in outgoing else {}


class RankFailed(RuntimeError):
    """Raised in the other ranks of a ThreadedWorld when one rank failed or a collective timed out."""


class _Shared:
    def __init__(self, world_size: int, timeout: float):
        self.barrier = threading.Barrier(world_size, timeout=timeout)
        # Two slot arrays used alternately: a rank can only reuse one after every rank has passed
        # the next collective's barrier, i.e. finished reading it, so one barrier per collective.
        self.slots: list[list[Any]] = [[None] * world_size, [None] * world_size]


class ThreadComm:
    """One rank's handle on a ThreadedWorld."""

    def __init__(self, shared: _Shared, rank: int, world_size: int):
        self._shared = shared
        self._rank = rank
        self._world = world_size
        self._generation = 0

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world

    def _wait(self) -> None:
        try:
            self._shared.barrier.wait()
        except threading.BrokenBarrierError:
            raise RankFailed(f"rank {self._rank}: another rank failed or a collective timed out") from None

    def _swap(self, value: Any) -> list[Any]:
        slots = self._shared.slots[self._generation % 2]
        self._generation += 1
        slots[self._rank] = value
        self._wait()
        return list(slots)

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [pickle.loads(blob) for blob in self._swap(pickle.dumps(obj, protocol=5))]

    def barrier(self) -> None:
        self._wait()

    def exchange_bytes(self, outgoing: Mapping[int, bytes]) -> dict[int, bytes]:
        boxes = self._swap({int(dst): bytes(buf) for dst, buf in outgoing.items()})
        return {src: box[self._rank] for src, box in enumerate(boxes) if self._rank in box}


class ThreadedWorld:
    """Simulate `world_size` ranks as threads: `ThreadedWorld(4).run(fn)` calls fn(comm) on each.

    Returns the per-rank results in rank order. If a rank raises, the others are released from
    their collectives (RankFailed) and the first real exception is re-raised.
    """

    def __init__(self, world_size: int, *, timeout: float = 120.0):
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.timeout = timeout

    def run(self, fn: Callable[[ThreadComm], T]) -> list[T]:
        shared = _Shared(self.world_size, self.timeout)
        results: list[Any] = [None] * self.world_size
        errors: list[BaseException | None] = [None] * self.world_size

        def body(rank: int) -> None:
            try:
                results[rank] = fn(ThreadComm(shared, rank, self.world_size))
            except BaseException as e:  # re-raised in the caller thread
                errors[rank] = e
                shared.barrier.abort()

        threads = [threading.Thread(target=body, args=(r,), name=f"rank{r}", daemon=True) for r in range(self.world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        real = [e for e in errors if e is not None and not isinstance(e, RankFailed)]
        if real:
            raise real[0]
        if any(errors):
            raise next(e for e in errors if e is not None)
        return results


def run_threaded(world_size: int, fn: Callable[[ThreadComm], T]) -> list[T]:
    """Shorthand for `ThreadedWorld(world_size).run(fn)`."""
    return ThreadedWorld(world_size).run(fn)
