"""Requests, the slot table of continuous batching, and the length buckets that bound recompiles.

The scheduler only does bookkeeping (who waits, who holds which slot, when a request is done); the
engine runs the model. Admission is first come, first served: whenever a slot is free at the start
of an engine step, the oldest waiting request takes it.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .sampling import SamplingParams


class RequestError(ValueError):
    """A request the engine cannot run (bad ids, too long for the cache); one line."""


def length_buckets(smallest: int, largest: int) -> tuple[int, ...]:
    """Powers of two from `smallest` up to `largest`, and `largest` itself."""
    out = []
    size = smallest
    while size < largest:
        out.append(size)
        size *= 2
    out.append(largest)
    return tuple(out)


def pick_bucket(buckets: Sequence[int], length: int) -> int:
    for size in buckets:
        if size >= length:
            return size
    raise RequestError(f"length {length} exceeds the largest bucket {buckets[-1]}")


_ids = itertools.count(1)


@dataclass(eq=False)
class Request:
    """One prompt being continued. Read its fields after `done` is set (or in `on_update`)."""

    prompt_ids: list[int]
    params: SamplingParams
    stop_ids: frozenset[int]
    on_update: Callable[[Request, list[int]], None] | None = None
    id: int = field(default_factory=lambda: next(_ids))
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list = field(default_factory=list)   # TokenLogprob per output id (params.logprobs set)
    prompt_logprobs: list | None = None     # TokenLogprob | None per prompt id (params.prompt_logprobs set)
    finish_reason: str | None = None        # "stop" | "length" | "cancelled" (or the caller's reason)
    stop_token: int | None = None           # the stop id that ended it, if one did
    slot: int | None = None
    submitted_at: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    finished_at: float | None = None
    done: threading.Event = field(default_factory=threading.Event)
    _cancel_reason: str | None = None

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.params.seed)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def completion_tokens(self) -> int:
        """Tokens the model produced, the stop token included (it cost a step like any other)."""
        return len(self.output_ids) + (self.stop_token is not None)

    def cancel(self, reason: str = "cancelled") -> None:
        """Ask the engine to end this request at its next step (thread-safe); `reason` becomes the
        finish_reason (e.g. "stop" when the caller found a stop string in the text)."""
        if self._cancel_reason is None:
            self._cancel_reason = reason

    def wait(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)


class Scheduler:
    """Waiting queue (thread-safe submit) and the slot table (engine thread only)."""

    def __init__(self, slots: int):
        self.slots: list[Request | None] = [None] * slots
        self._waiting: deque[Request] = deque()
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)

    def submit(self, request: Request) -> None:
        with self._wakeup:
            self._waiting.append(request)
            self._wakeup.notify()

    def wait_for_work(self, timeout: float | None = None) -> bool:
        """Block until a request waits (or `timeout`); True when there is anything to do."""
        with self._wakeup:
            if not self._waiting and not self.active():
                self._wakeup.wait(timeout)
            return bool(self._waiting) or bool(self.active())

    def take_cancelled_waiting(self) -> list[Request]:
        with self._lock:
            gone = [r for r in self._waiting if r._cancel_reason is not None]
            for r in gone:
                self._waiting.remove(r)
        return gone

    def take_all_waiting(self) -> list[Request]:
        with self._lock:
            gone = list(self._waiting)
            self._waiting.clear()
        return gone

    def admit(self) -> list[Request]:
        """Oldest waiting requests into free slots; returns the newly seated ones."""
        seated = []
        with self._lock:
            for slot, holder in enumerate(self.slots):
                if holder is None and self._waiting:
                    request = self._waiting.popleft()
                    request.slot = slot
                    self.slots[slot] = request
                    seated.append(request)
        return seated

    def release(self, request: Request) -> None:
        if request.slot is not None and self.slots[request.slot] is request:
            self.slots[request.slot] = None

    def active(self) -> list[Request]:
        return [r for r in self.slots if r is not None]

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._waiting)
