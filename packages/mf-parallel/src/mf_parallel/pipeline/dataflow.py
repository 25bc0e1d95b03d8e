"""Dependencies between the computations of a pipeline step, and their timing for given costs.

`F(mb, s)` needs the activation of `F(mb, s-1)`; `B(mb, s)` needs the gradient of `B(mb, s+1)` and
its own `F(mb, s)`; `W(mb, s)` needs `B(mb, s)`. `timings` runs per-rank compute orders with these
dependencies and unit costs (communication takes no time, a rank starts an action as soon as it is
free and the inputs exist): the plan from which schedules place their communication, and the
reference the simulator's results are checked against.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from fractions import Fraction

from mf_parallel.errors import ParallelConfigError
from mf_parallel.pipeline.actions import Combined, Compute
from mf_parallel.pipeline.stages import Placement

Key = tuple[str, int, int]          # (op, mb, virtual stage)


@dataclass(frozen=True)
class Costs:
    """Time of one F, B (input gradient) and W (weight gradient) of one chunk. Unsplit backward = B + W."""

    F: float = 1
    B: float = 1
    W: float = 1

    def __post_init__(self) -> None:
        for name in ("F", "B", "W"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)) or not value > 0 \
                    or not math.isfinite(value):
                raise ParallelConfigError(f"pipeline costs: {name} must be a positive finite number, got {value!r}")

    @classmethod
    def parse(cls, text: str) -> Costs:
        """'F,B,W' (e.g. '1,2,1') -> Costs; one clear error otherwise."""
        parts = [p.strip() for p in str(text).split(",")]
        if len(parts) != 3:
            raise ParallelConfigError(f"--costs: expected three numbers F,B,W such as 1,1,1, got {text!r}")
        try:
            values = [float(p) for p in parts]
        except ValueError:
            raise ParallelConfigError(f"--costs: expected three numbers F,B,W such as 1,1,1, got {text!r}") from None
        return cls(*[int(v) if v.is_integer() else v for v in values])

    def of(self, op: str, split: bool):
        if op == "F":
            return self.F
        if op == "B":
            return self.B if split else self.B + self.W
        return self.W

    def exact(self) -> Costs:
        """The same costs as Fractions: plans compare times for equality, which floats would blur
        (whole numbers stay ints: as exact, and several times faster to add and compare)."""
        exact = [Fraction(getattr(self, n)).limit_denominator(10 ** 6) for n in ("F", "B", "W")]
        return Costs(*(int(v) if v.denominator == 1 else v for v in exact))


def key(c: Compute) -> Key:
    return (c.op, c.mb, c.stage)


def dependencies(c: Compute, virtual_stages: int) -> list[Key]:
    """The computations whose results `c` consumes."""
    if c.op == "F":
        return [("F", c.mb, c.stage - 1)] if c.stage > 0 else []
    if c.op == "B":
        deps = [("F", c.mb, c.stage)]
        if c.stage < virtual_stages - 1:
            deps.append(("B", c.mb, c.stage + 1))
        return deps
    return [("B", c.mb, c.stage)]


def action_cost(action, costs: Costs, split: bool):
    if isinstance(action, Combined):
        return costs.of("F", split) + costs.of("B", split)
    return costs.of(action.op, split)


def action_deps(action, virtual_stages: int) -> list[Key]:
    if isinstance(action, Combined):
        inner = {key(action.forward), key(action.backward)}
        return [d for part in (action.forward, action.backward) for d in dependencies(part, virtual_stages)
                if d not in inner]
    return dependencies(action, virtual_stages)


def action_keys(action) -> list[Key]:
    if isinstance(action, Combined):
        return [key(action.forward), key(action.backward)]
    return [key(action)]


class InfeasibleOrder(ParallelConfigError):
    """The compute orders wait on each other in a cycle (a bug in a schedule generator)."""


def timings(placement: Placement, orders: list[list], costs: Costs, split: bool) -> list[list[tuple]]:
    """(start, end) of every action of every rank's compute order (Compute or Combined).

    A rank runs its order until an action's input does not exist yet, and waits on that input: the
    action producing it wakes the rank again (each action is looked at a bounded number of times,
    so the work grows with the number of actions, not with ranks x actions)."""
    v = placement.virtual_stages
    end: dict[Key, object] = {}
    free = [0] * placement.pp
    pos = [0] * placement.pp
    out: list[list[tuple]] = [[] for _ in range(placement.pp)]
    waiting: dict[Key, list[int]] = {}
    ready = deque(range(placement.pp))
    while ready:
        r = ready.popleft()
        order = orders[r]
        while pos[r] < len(order):
            action = order[pos[r]]
            deps = action_deps(action, v)
            missing = next((d for d in deps if d not in end), None)
            if missing is not None:
                waiting.setdefault(missing, []).append(r)
                break
            start = max([free[r], *(end[d] for d in deps)])
            finish = start + action_cost(action, costs, split)
            for k in action_keys(action):
                end[k] = finish
                ready.extend(waiting.pop(k, ()))
            out[r].append((start, finish))
            free[r] = finish
            pos[r] += 1
    stuck = {r: orders[r][pos[r]] for r in range(placement.pp) if pos[r] < len(orders[r])}
    if stuck:
        raise InfeasibleOrder(f"pipeline schedule: the compute orders wait on each other: {stuck}")
    return out
