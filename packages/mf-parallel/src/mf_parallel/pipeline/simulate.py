"""Run action lists on a clock: per-rank busy and idle time, bubble, activations in flight.

Each F / B / W of one chunk costs `Costs.F` / `.B` / `.W` (an unsplit backward B + W, a Combined
action the sum of its parts); communication takes no time. Three p2p semantics:

- "async" (`pipeline_parallel_overlap_p2p` on an asynchronous backend): sends never wait and a
  receive is posted at its Comm but waited for only by the computation that consumes it. Pure
  dataflow: the textbook bubble formulas assume this.
- "blocking": sends never wait; a receive completes at its Comm (the message must have been sent).
- "rendezvous" (MCCL on CPU: the emulated send_recv is an all-reduce of the two ranks, measured to
  block both until both arrive, and to hold back every op issued after it): a Comm completes when
  both ranks have reached it, and both continue from there.

Per rank: `span` runs from its first computation's start to its last one's end, `idle` is the
span minus its busy time (the waits between computations). The step's `bubble` is the largest
idle time (the zero-bubble paper's "longest stage time minus the work of a stage") and
`bubble_fraction` that bubble over the longest span: for 1F1B and GPipe (p - 1) / (m + p - 1).
Activations in flight: (micro-batch, chunk) forwards whose backward (W when split) has not run.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from mf_parallel.errors import ParallelConfigError
from mf_parallel.pipeline.actions import Combined, Comm, Compute, Schedule, computes
from mf_parallel.pipeline.dataflow import Costs
from mf_parallel.pipeline.schedules import zbv_bubble
from mf_parallel.pipeline.stages import Placement

P2P_MODES = ("async", "blocking", "rendezvous")


@dataclass
class RankTimeline:
    rank: int
    intervals: list[tuple] = field(default_factory=list)    # (start, end, action) of computations
    busy: float = 0
    first: float = 0
    last: float = 0
    peak_in_flight: int = 0

    @property
    def span(self) -> float:
        return self.last - self.first

    @property
    def idle(self) -> float:
        return self.span - self.busy


@dataclass
class Simulation:
    schedule: Schedule
    costs: Costs
    p2p: str
    ranks: list[RankTimeline]

    @property
    def makespan(self) -> float:
        return max(r.last for r in self.ranks)

    @property
    def bubble(self) -> float:
        return max(r.idle for r in self.ranks)

    @property
    def bubble_fraction(self) -> float:
        span = max(r.span for r in self.ranks)
        return self.bubble / span if span else 0.0

    @property
    def peak_in_flight(self) -> list[int]:
        return [r.peak_in_flight for r in self.ranks]


def _input_messages(placement: Placement, c: Compute, rank: int) -> list[tuple]:
    """Keys (kind, mb, boundary) of the cross-rank messages computation `c` consumes."""
    if c.op == "F" and c.stage > 0 and placement.rank_of(c.stage - 1) != rank:
        return [("act", c.mb, c.stage - 1)]
    if c.op == "B" and c.stage < placement.virtual_stages - 1 and placement.rank_of(c.stage + 1) != rank:
        return [("grad", c.mb, c.stage)]
    return []


def simulate(schedule: Schedule, costs: Costs | None = None, p2p: str = "async",
             stage_costs: dict[int, Costs] | None = None) -> Simulation:
    """Time `schedule`'s action lists (see the module docstring). `stage_costs` gives some virtual
    stages their own costs (e.g. measured ones: the last stage also runs the head and the loss)."""
    costs = costs or Costs()
    stage_costs = stage_costs or {}
    if p2p not in P2P_MODES:
        raise ParallelConfigError(f"simulate: p2p must be one of {', '.join(P2P_MODES)}, got {p2p!r}")
    placement = Placement(schedule.pp, schedule.chunks, schedule.style)
    split, lists, pp = schedule.split_backward, schedule.ranks, schedule.pp
    pos, clock = [0] * pp, [0] * pp
    sent_at: dict[tuple, object] = {}        # (kind, mb, boundary) -> when its sender posted it
    out = [RankTimeline(r) for r in range(pp)]
    held = [0] * pp
    freeing = "W" if split else "B"

    # A rank runs its list until it must wait: for a message (its key) or, under rendezvous, for
    # its peer to reach the matching Comm (("rank", peer)). Whatever it waits for wakes it again,
    # so the work grows with the number of actions, not with ranks x actions.
    waiting: dict[tuple, list[int]] = {}
    ready = deque(range(pp))

    def post(key: tuple, when) -> None:
        if key not in sent_at:
            sent_at[key] = when
            ready.extend(waiting.pop(key, ()))

    def advance(r: int) -> None:
        pos[r] += 1
        ready.extend(waiting.pop(("rank", r), ()))

    def step(r: int) -> tuple | None:
        """None when rank r ran its next action, else what it waits for."""
        action = lists[r][pos[r]]
        if isinstance(action, Comm):
            return _comm(r, action)
        parts = computes(action)
        needs = [k for c in parts for k in _input_messages(placement, c, r)]
        if p2p == "async":
            missing = next((k for k in needs if k not in sent_at), None)
            if missing is not None:
                return missing
        start = max([clock[r], *(sent_at[k] for k in needs)]) if p2p == "async" else clock[r]
        cost = sum(stage_costs.get(c.stage, costs).of(c.op, split) for c in parts)
        line = out[r]
        if not line.intervals:
            line.first = start
        line.intervals.append((start, start + cost, action))
        line.busy += cost
        line.last = clock[r] = start + cost
        for c in parts:
            held[r] += 1 if c.op == "F" else -1 if c.op == freeing else 0
            line.peak_in_flight = max(line.peak_in_flight, held[r])
        advance(r)
        return None

    def _comm(r: int, action: Comm) -> tuple | None:
        keys_in = [(m.kind, m.mb, m.boundary) for m in action.recvs]
        if p2p == "rendezvous":
            peer = action.peer
            if pos[peer] >= len(lists[peer]) or lists[peer][pos[peer]] != action.mirror(r):
                return ("rank", peer)
            clock[r] = clock[peer] = max(clock[r], clock[peer])
            for m in (*action.sends, *action.recvs):
                sent_at[(m.kind, m.mb, m.boundary)] = clock[r]
            advance(r)
            advance(peer)
            return None
        for m in action.sends:
            post((m.kind, m.mb, m.boundary), clock[r])
        if p2p == "blocking":
            missing = next((k for k in keys_in if k not in sent_at), None)
            if missing is not None:
                return missing
            clock[r] = max([clock[r], *(sent_at[k] for k in keys_in)])
        advance(r)
        return None

    while ready:
        r = ready.popleft()
        while pos[r] < len(lists[r]):
            wait = step(r)
            if wait is not None:
                if r not in waiting.setdefault(wait, []):
                    waiting[wait].append(r)
                break
    stuck = {r: lists[r][pos[r]].label() for r in range(pp) if pos[r] < len(lists[r])}
    if stuck:
        raise ParallelConfigError(f"simulate: the action lists deadlock under {p2p} p2p: {stuck}")
    return Simulation(schedule, costs, p2p, out)


def textbook_bubble(schedule: Schedule, costs: Costs | None = None):
    """(formula, value) of the closed-form bubble (idle time of the busiest stage) of `schedule`,
    or None where no closed form holds:

    - GPipe / 1F1B / interleaved 1F1B: (p-1)(F+B+W) (per chunk; fraction (p-1)/(v m + p - 1));
    - 1F1B with the backward split (ZB-H1, Qi et al.), m >= p: (p-1)(F+B-W);
    - ZB-V at F = B = W: `schedules.zbv_bubble` (0 once m >= 2p - 1, the paper's zero bubble).
    """
    costs = costs or Costs()
    p, m = schedule.pp, schedule.microbatches
    if schedule.combined:
        return None
    if not schedule.split_backward and schedule.name in ("gpipe", "1f1b", "interleaved_1f1b"):
        return "(p-1)(F+B+W)", (p - 1) * (costs.F + costs.B + costs.W)
    if schedule.split_backward and schedule.name == "1f1b" and m >= p:
        return "(p-1)(F+B-W)", (p - 1) * (costs.F + costs.B - costs.W)
    if schedule.name == "zbv" and costs.F == costs.B == costs.W:
        if m >= 2 * p - 1:
            formula = "ZB-V at F=B=W (m >= 2p-1)"
        elif m >= p:
            formula = "ZB-V at F=B=W (p <= m < 2p-1): (2p-1-m)F"
        else:
            formula = "ZB-V at F=B=W (m < p): (4(p-1)-3(m-1))F"
        return formula, zbv_bubble(p, m) * costs.F
    return None


def expected_bubble(schedule: Schedule, costs: Costs | None = None):
    """The value of `textbook_bubble`, or None where no closed form is known."""
    known = textbook_bubble(schedule, costs)
    return None if known is None else known[1]


def describe_action(action) -> str:
    if isinstance(action, (Compute, Combined, Comm)):
        return action.label()
    return str(action)
