"""Ordered prefetching of batches by worker threads or processes.

`prefetched(make, tasks, workers, depth, processes)` yields `make(task)` for each task in order,
keeping up to `depth` tasks in flight on `workers` workers. Threads suit the usual case (the
batch reader spends its time in numpy copies, which release the GIL, and the training step in a
framework that releases it too); processes (`processes=True`) take the batch assembly out of the
training process entirely. Worker exceptions surface, in order, in the consumer.

Process workers receive `make` once, at start-up: with the "fork" start method (the default on
Linux) through the fork itself, otherwise pickled (datasets pickle their file paths and index
arrays; memory-mapped `.bin` files are re-opened, not copied).
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from functools import partial
from typing import Any

_worker_make: Callable[[Any], Any] | None = None


def _init_worker(make: Callable[[Any], Any]) -> None:
    global _worker_make
    _worker_make = make


def _run_in_worker(task: Any) -> Any:
    assert _worker_make is not None
    return _worker_make(task)


def default_start_method() -> str:
    return "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


def prefetched(
    make: Callable[[Any], Any],
    tasks: Iterable[Any],
    workers: int,
    depth: int,
    processes: bool = False,
    start_method: str | None = None,
) -> Iterator[Any]:
    """`make(t) for t in tasks`, computed ahead by a pool; the pool ends with the generator."""
    if workers <= 0:
        for task in tasks:
            yield make(task)
        return
    executor: Executor
    if processes:
        context = multiprocessing.get_context(start_method or default_start_method())
        executor = ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker, initargs=(make,))
        submit: Callable[[Any], Future] = partial(executor.submit, _run_in_worker)
    else:
        executor = ThreadPoolExecutor(workers, thread_name_prefix="mf-data")
        submit = partial(executor.submit, make)
    pending: deque[Future] = deque()
    it = iter(tasks)
    try:
        for task in it:
            pending.append(submit(task))
            if len(pending) >= depth:
                break
        while pending:
            result = pending.popleft().result()
            for task in it:
                pending.append(submit(task))
                break
            yield result
    finally:
        for fut in pending:
            fut.cancel()
        executor.shutdown(wait=True, cancel_futures=True)
