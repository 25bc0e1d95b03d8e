"""Checks every schedule must pass before anything runs it.

`validate(schedule)` raises `ScheduleError` (one line) unless:

1. each rank runs, for every micro-batch and every chunk it holds, exactly one F and one B (and
   one W when the backward is split), in the order F, then B, then W — so every micro-batch's
   activations are freed by the end of the step;
2. every activation / gradient that crosses ranks is sent once by its producer after it is
   computed and received once by its consumer before it is needed; nothing else is sent;
3. the Comms between two ranks are mirror images, in the same order on both;
4. the lists run to the end when every Comm blocks until both ranks reach it (the strictest p2p
   semantics; what MCCL's emulated send_recv does), so they cannot deadlock on any backend.

It returns each rank's peak of (micro-batch, chunk) activations held at once.
"""

from __future__ import annotations

from collections import Counter, defaultdict, deque

from mf_parallel.errors import ParallelConfigError
from mf_parallel.pipeline.actions import Comm, Schedule, computes
from mf_parallel.pipeline.comm_plan import outgoing
from mf_parallel.pipeline.stages import Placement


class ScheduleError(ParallelConfigError):
    """A schedule that would compute wrong gradients, leak activations or deadlock."""


def _fail(schedule: Schedule, problem: str) -> None:
    raise ScheduleError(f"pipeline schedule {schedule.describe()}: {problem}")


def _check_computations(schedule: Schedule, placement: Placement) -> list[int]:
    ops = ("F", "B", "W") if schedule.split_backward else ("F", "B")
    peaks = []
    for rank in range(schedule.pp):
        seen: dict[tuple, int] = {}
        held = peak = 0
        for pos, c in enumerate(schedule.compute_order(rank)):
            if c.op not in ops:
                _fail(schedule, f"rank {rank} runs {c.op} but the schedule has ops {'/'.join(ops)}")
            if placement.owner(c.stage) != (rank, c.chunk):
                _fail(schedule, f"rank {rank} runs {c.label()} of virtual stage {c.stage}, which it does not hold")
            k = (c.op, c.mb, c.stage)
            if k in seen:
                _fail(schedule, f"rank {rank} runs {c.op} of micro-batch {c.mb} on stage {c.stage} twice")
            seen[k] = pos
            previous = {"B": "F", "W": "B"}.get(c.op)
            if previous and (previous, c.mb, c.stage) not in seen:
                _fail(schedule, f"rank {rank} runs {c.op}{c.mb} on stage {c.stage} before its {previous}")
            held += 1 if c.op == "F" else -1 if c.op == ops[-1] else 0
            peak = max(peak, held)
        for chunk in range(schedule.chunks):
            stage = placement.stage(rank, chunk)
            for mb in range(schedule.microbatches):
                for op in ops:
                    if (op, mb, stage) not in seen:
                        _fail(schedule, f"rank {rank} never runs {op} of micro-batch {mb} on stage {stage}")
        if held:
            _fail(schedule, f"rank {rank} ends the step holding {held} activations")
        peaks.append(peak)
    return peaks


def _check_messages(schedule: Schedule, placement: Placement) -> None:
    for rank in range(schedule.pp):
        produced, needed = {}, {}
        for pos, action in enumerate(schedule.actions(rank)):
            for c in computes(action):
                for msg in outgoing(placement, c, rank):
                    produced[msg] = pos
                dep_stage = c.stage - 1 if c.op == "F" else c.stage + 1 if c.op == "B" else None
                if dep_stage is not None and 0 <= dep_stage < placement.virtual_stages:
                    src = placement.rank_of(dep_stage)
                    if src != rank:
                        boundary = min(c.stage, dep_stage)
                        kind = "act" if c.op == "F" else "grad"
                        needed[(kind, c.mb, boundary, src, rank)] = (pos, c)
        sent, received = Counter(), {}
        for pos, action in enumerate(schedule.actions(rank)):
            if not isinstance(action, Comm):
                continue
            for msg in action.sends:
                if msg.src != rank or msg.dst != action.peer:
                    _fail(schedule, f"rank {rank} sends {msg.label()} ({msg.src}->{msg.dst}) in a Comm with {action.peer}")
                if msg not in produced:
                    _fail(schedule, f"rank {rank} sends {msg.label()}, which it never computes")
                if pos < produced[msg]:
                    _fail(schedule, f"rank {rank} sends {msg.label()} before computing it")
                sent[msg] += 1
            for msg in action.recvs:
                if msg.dst != rank or msg.src != action.peer:
                    _fail(schedule, f"rank {rank} receives {msg.label()} ({msg.src}->{msg.dst}) from {action.peer}")
                received[(msg.kind, msg.mb, msg.boundary, msg.src, msg.dst)] = pos
        for msg, count in sent.items():
            if count != 1:
                _fail(schedule, f"rank {rank} sends {msg.label()} {count} times")
        missing = set(produced) - set(sent)
        if missing:
            _fail(schedule, f"rank {rank} never sends {sorted(m.label() for m in missing)[:4]}")
        for k, (pos, c) in needed.items():
            if k not in received:
                _fail(schedule, f"rank {rank} never receives the input of {c.label()} on stage {c.stage}")
            if received[k] > pos:
                _fail(schedule, f"rank {rank} receives the input of {c.label()} on stage {c.stage} after running it")
        extra = set(received) - set(needed)
        if extra:
            _fail(schedule, f"rank {rank} receives messages nothing consumes: {sorted(extra)[:3]}")


def _check_matching_and_progress(schedule: Schedule) -> None:
    per_pair: dict[tuple[int, int], list[Comm]] = defaultdict(list)
    for rank in range(schedule.pp):
        for action in schedule.actions(rank):
            if isinstance(action, Comm):
                per_pair[(rank, action.peer)].append(action)
    for (a, b), comms in per_pair.items():
        theirs = [c.mirror(b) for c in per_pair.get((b, a), [])]
        if comms != theirs:
            first = next((i for i, (x, y) in enumerate(zip(comms, theirs)) if x != y), min(len(comms), len(theirs)))
            _fail(schedule, f"the Comms of ranks {a} and {b} do not pair up (first difference at their Comm #{first})")
    # Rendezvous simulation: a Comm completes only when both ranks stand at it. A rank stopped at a
    # Comm waits for its peer to move (which wakes it): work in the number of actions, not ranks x actions.
    pos = [0] * schedule.pp
    lists = schedule.ranks
    waiting: dict[int, list[int]] = defaultdict(list)      # peer -> ranks stopped until it moves
    ready = deque(range(schedule.pp))

    def moved(r: int) -> None:
        pos[r] += 1
        ready.extend(waiting.pop(r, ()))

    while ready:
        r = ready.popleft()
        while pos[r] < len(lists[r]):
            action = lists[r][pos[r]]
            if not isinstance(action, Comm):
                moved(r)
                continue
            p = action.peer
            if pos[p] < len(lists[p]) and lists[p][pos[p]] == action.mirror(r):
                moved(r)
                moved(p)
                continue
            if r not in waiting[p]:
                waiting[p].append(r)
            break
    stuck = {r: lists[r][pos[r]].label() for r in range(schedule.pp) if pos[r] < len(lists[r])}
    if stuck:
        _fail(schedule, f"blocking p2p deadlocks: {stuck}")


def validate(schedule: Schedule) -> list[int]:
    """Raise ScheduleError unless `schedule` is correct (see the module docstring); return each
    rank's peak number of (micro-batch, chunk) activations held."""
    placement = Placement(schedule.pp, schedule.chunks, schedule.style)
    peaks = _check_computations(schedule, placement)
    _check_messages(schedule, placement)
    _check_matching_and_progress(schedule)
    return peaks
