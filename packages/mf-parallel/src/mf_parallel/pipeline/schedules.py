"""Pipeline schedules as data: pure functions of (pp, micro-batches, chunks) -> every rank's actions.

Compute orders (which F / B / W each rank runs, in which order):

- `gpipe`: every forward, then every backward (GPipe).
- `1f1b`: rank r runs min(pp - 1 - r, m) warm-up forwards, then alternates one forward and one
  backward, then drains the backwards (PipeDream-flush / Megatron's 1F1B).
- `interleaved_1f1b`: Megatron's interleaved 1F1B over `chunks` chunks per rank: virtual
  micro-batches go through the chunks in groups of pp micro-batches, (pp - r - 1) * 2 +
  (chunks - 1) * pp warm-up forwards on rank r; needs m to be a multiple of pp.
- split backward (`enable_dxdw_split`, ZB-H1 style): the same F / B order, B computing only the
  input gradient (sent upstream at once) and each W (the weight gradient) deferred: a W runs when
  the rank would otherwise wait, or when the rank already holds as many unfinished micro-batches
  as rank 0 of the unsplit schedule does (so peak memory stays that of 1F1B), or at the end.
- `zbv` (ZB-V, Qi et al. 2023, the V-shape schedule): two chunks per rank in a V (chunk 0 is
  virtual stage r, chunk 1 is 2p-1-r), backward split; a fixed per-rank order in the paper's three
  phases (see `zbv_order`). With F = B = W every rank is busy from its first computation to its
  last once m >= 2p - 1 (zero bubble, the paper's (p-1)(T_F + T_B - 2 T_W) = 0), while holding at
  most 2p chunk activations: 1F1B's p whole micro-batches. `zbv_bubble` is the exact idle time.

The ZB-H1 W placement is a greedy choice made on a plan with costs F = B = W = 1 (what the
handcrafted schedules of the zero-bubble paper assume); the resulting order is then fixed,
whatever the real costs.

`pipeline_parallel_overlap_b_f` runs a steady-state forward and a backward of another micro-batch
as one `Combined` action, so that on an asynchronous backend the communication of one (a MoE
layer's token exchange, the stage's p2p) overlaps the computation of the other:

- interleaved 1F1B: a forward and the backward of another chunk that follows it on the rank
  (Megatron's combined 1F1B);
- every other schedule: a backward and the forward that follows it (HyperParallel's OVERLAP_B_F,
  what MindFormers runs: F_1, [B_1, F_2], ..., B_n in the steady state). Plain 1F1B then warms up
  with 2(pp - 1 - r) forwards on rank r (HyperParallel's and Megatron's interleaved warm-up with
  one chunk) instead of pp - 1 - r: with the shorter warm-up each pair would hold back the
  activation the next stage waits for (measured on the plan: 21 units against 15 for pp 2, m 4),
  with it the planned step is exactly 1F1B's. The price is activations: rank r holds up to
  min(2(pp - r) - 1, m) micro-batches instead of pp - r.

A pair is kept only where it does not lengthen the planned step (a fused pair starts when both
inputs exist and its outputs leave together); where no pair qualifies (gpipe runs every forward
first, ZB-V follows each B by its W, too few micro-batches for a steady state) the schedule is
the one without the flag. Communication is then placed by `comm_plan.place_communication`, which
makes the lists safe for blocking p2p.
"""

from __future__ import annotations

from collections import deque

from mf_parallel.errors import ParallelConfigError
from mf_parallel.pipeline.actions import Combined, Compute, Schedule
from mf_parallel.pipeline.comm_plan import place_communication
from mf_parallel.pipeline.dataflow import Costs, InfeasibleOrder, dependencies, timings
from mf_parallel.pipeline.stages import PipelineSpec, Placement

PLAN_COSTS = Costs(1, 1, 1)


def _compute(placement: Placement, op: str, mb: int, stage: int) -> Compute:
    rank, chunk = placement.owner(stage)
    return Compute(op, mb, chunk, stage)


# ----------------------------------------------------------------------------- static orders
def gpipe_order(placement: Placement, m: int, rank: int) -> list[Compute]:
    s = placement.stage(rank, 0)
    return [_compute(placement, "F", i, s) for i in range(m)] + [_compute(placement, "B", i, s) for i in range(m)]


def one_f_one_b_order(placement: Placement, m: int, rank: int, warmup: int | None = None) -> list[Compute]:
    """1F1B; `warmup` forwards before the steady state (default pp - 1 - rank, Megatron's)."""
    s = placement.stage(rank, 0)
    warmup = min(placement.pp - 1 - rank if warmup is None else warmup, m)
    order = [_compute(placement, "F", i, s) for i in range(warmup)]
    for i in range(m - warmup):
        order += [_compute(placement, "F", warmup + i, s), _compute(placement, "B", i, s)]
    order += [_compute(placement, "B", i, s) for i in range(m - warmup, m)]
    return order


def interleaved_order(placement: Placement, m: int, rank: int) -> list[Compute]:
    """Megatron's interleaved 1F1B (virtual micro-batch k -> (micro-batch, chunk))."""
    pp, v = placement.pp, placement.chunks
    total = m * v

    def micro(k: int, backward: bool) -> Compute:
        group, within = divmod(k, pp * v)
        chunk = within // pp
        if backward:
            chunk = v - 1 - chunk
        mb = group * pp + within % pp
        return _compute(placement, "B" if backward else "F", mb, placement.stage(rank, chunk))

    if m == pp:
        warmup = total                       # Megatron: every forward first when m == pp
    else:
        warmup = min((pp - rank - 1) * 2 + (v - 1) * pp, total)
    order = [micro(k, False) for k in range(warmup)]
    for k in range(total - warmup):
        order += [micro(warmup + k, False), micro(k, True)]
    order += [micro(k, True) for k in range(total - warmup, total)]
    return order


def peak_in_flight(order: list[Compute]) -> int:
    """Most (micro-batch, chunk) forwards held at once by an unsplit order (freed by their B)."""
    held = peak = 0
    for c in order:
        held += 1 if c.op == "F" else -1 if c.op == "B" else 0
        peak = max(peak, held)
    return peak


# ----------------------------------------------------------------------------- greedy (split) orders
class _Greedy:
    """Event-driven list scheduling on the plan costs, for the ZB-H1-style W placement.

    Ranks decide in order of the time they become free, so when a rank decides at time t, every
    computation that finishes by t is known (it started earlier, on a rank that already decided).
    """

    def __init__(self, placement: Placement, m: int, caps: list[int], costs: Costs = PLAN_COSTS) -> None:
        self.p, self.m, self.caps, self.costs = placement, m, caps, costs.exact()
        self.v = placement.virtual_stages
        self.end: dict[tuple, object] = {}
        self.orders: list[list[Compute]] = [[] for _ in range(placement.pp)]
        self.held = [0] * placement.pp                 # forwards whose W has not run
        self.pending_w: list[deque] = [deque() for _ in range(placement.pp)]

    def ready_at(self, c: Compute):
        """When `c`'s inputs exist, or None if some producer is not scheduled yet."""
        times = [self.end.get(d) for d in dependencies(c, self.v)]
        if any(t is None for t in times):
            return None
        return max(times, default=0)

    def run(self, rank: int, c: Compute, start):
        finish = start + self.costs.of(c.op, True)
        self.end[(c.op, c.mb, c.stage)] = finish
        self.orders[rank].append(c)
        if c.op == "F":
            self.held[rank] += 1
        elif c.op == "B":
            self.pending_w[rank].append(Compute("W", c.mb, c.chunk, c.stage))
        else:
            self.held[rank] -= 1
        return finish

    def schedule(self, choose) -> list[list[Compute]]:
        """`choose(rank, t) -> (Compute, start) | ("wait", time or None) | None (rank done)`.

        A rank that waits is woken at `time` or at the next moment another rank becomes free,
        whichever comes first: something it waits for may be scheduled then.
        """
        free = [0] * self.p.pp
        done = [False] * self.p.pp
        asleep = [False] * self.p.pp                   # waiting for something not scheduled yet
        while not all(done):
            live = [r for r in range(self.p.pp) if not done[r] and not asleep[r]]
            if not live:
                raise InfeasibleOrder("pipeline schedule: the greedy plan waits on itself (every rank blocked)")
            r = min(live, key=lambda i: (free[i], i))
            decision = choose(r, free[r])
            if decision is None:
                done[r] = True
            elif decision[0] == "wait":
                later = [free[j] for j in live if j != r and free[j] > free[r]]
                if decision[1] is not None:
                    later.append(decision[1])
                if later:
                    free[r] = min(later)
                else:
                    asleep[r] = True
            else:
                c, start = decision
                free[r] = self.run(r, c, start)
                asleep = [False] * self.p.pp            # something new is known: wake the sleepers
        return self.orders


def zb_split_orders(placement: Placement, m: int, fb_orders: list[list[Compute]]) -> list[list[Compute]]:
    """ZB-H1-style: the given F / B orders with each W deferred into the rank's idle time."""
    cap = max(peak_in_flight(o) for o in fb_orders)   # rank 0's: the peak of the unsplit schedule
    g = _Greedy(placement, m, [cap] * placement.pp)
    pos = [0] * placement.pp

    def choose(r: int, t):
        order = fb_orders[r]
        nxt = order[pos[r]] if pos[r] < len(order) else None
        if nxt is None:
            if g.pending_w[r]:
                return g.pending_w[r].popleft(), t
            return None
        if nxt.op == "F" and g.held[r] >= g.caps[r] and g.pending_w[r]:
            return g.pending_w[r].popleft(), t
        ready = g.ready_at(nxt)
        if ready is not None and ready <= t:
            pos[r] += 1
            return nxt, t
        if g.pending_w[r]:
            return g.pending_w[r].popleft(), t
        if ready is None:
            return ("wait", None)
        pos[r] += 1
        return nxt, ready

    return g.schedule(choose)


def zbv_order(placement: Placement, m: int, rank: int) -> list[Compute]:
    """ZB-V's order on `rank` (p ranks, m micro-batches), the paper's warm-up / steady / cool-down.

    Warm-up: 2(p - r) - 1 forwards of chunk 0 (rank 0 runs the most: the V's far end must fill
    first), then r pairs (F chunk 1, F chunk 0), then p - r triples (F, B, W) of chunk 1 — each W
    right after its B so the rank never holds more than 2p chunk activations. Steady state: triples
    (F, B, W) of chunk 0, then of chunk 1, until every forward has run. Cool-down: r pairs of
    backwards (chunk 0, chunk 1) with their W deferred into the tail where the rank would otherwise
    wait for the backward coming back down the V, p - r (B, W) of chunk 0, then the deferred Ws.
    With fewer micro-batches than a phase asks for, the phase takes what exists (every count is
    clipped), so the order is valid for every m >= 1; its bubble is then `zbv_bubble`'s.
    """
    p = placement.pp
    stages = (placement.stage(rank, 0), placement.stage(rank, 1))
    count = {op: [0, 0] for op in "FBW"}        # next micro-batch per (op, chunk)
    order: list[Compute] = []

    def run(op: str, chunk: int) -> bool:
        done = count[op][chunk]
        limit = m if op == "F" else count["F" if op == "B" else "B"][chunk]
        if done >= limit:
            return False
        order.append(Compute(op, done, chunk, stages[chunk]))
        count[op][chunk] += 1
        return True

    def repeat(times: int, *ops: tuple[str, int]) -> None:
        for _ in range(times):
            for op, chunk in ops:
                run(op, chunk)

    repeat(2 * (p - rank) - 1, ("F", 0))
    repeat(rank, ("F", 1), ("F", 0))
    repeat(p - rank, ("F", 1), ("B", 1), ("W", 1))
    while count["F"][0] < m or count["F"][1] < m:
        repeat(1, ("F", 0), ("B", 0), ("W", 0), ("F", 1), ("B", 1), ("W", 1))
    repeat(rank, ("B", 0), ("B", 1))
    repeat(p - rank, ("B", 0), ("W", 0))
    while run("B", 1) or run("B", 0):
        pass
    while run("W", 1) or run("W", 0):
        pass
    return order


def zbv_bubble(pp: int, m: int) -> int:
    """The exact idle time (busiest rank, unit costs F = B = W = 1 per chunk) of `zbv_order`.

    0 once m >= 2p - 1 (the paper's zero bubble); 2p - 1 - m for p <= m < 2p - 1 (the steady state
    is too short to hide the turn of the V); 4(p - 1) - 3(m - 1) for m <= p (one micro-batch idles
    4(p - 1), each further one fills 3 units of it). Rank 0 is the busiest rank in each case.
    """
    if m >= 2 * pp - 1:
        return 0
    if m >= pp:
        return 2 * pp - 1 - m
    return 4 * (pp - 1) - 3 * (m - 1)


# ----------------------------------------------------------------------------- combined F + B
def _plan_bubble(placement: Placement, orders: list[list], split: bool):
    times = timings(placement, orders, PLAN_COSTS, split)
    return max((t[-1][1] - t[0][0]) - sum(e - s for s, e in t) for t in times if t)


def _pairs_forward_backward(a, b) -> Combined | None:
    """Interleaved 1F1B: a forward, then the backward of another chunk. Within one chunk the pair
    is the forward of a later micro-batch waiting for the backward the next stage needs first:
    the critical path would run through every pair."""
    if a.op == "F" and b.op == "B" and a.chunk != b.chunk:
        return Combined(a, b)
    return None


def _pairs_backward_forward(a, b) -> Combined | None:
    """A backward, then the forward of another micro-batch (independent of each other)."""
    if a.op == "B" and b.op == "F" and a.mb != b.mb:
        return Combined(b, a, backward_first=True)
    return None


def combine_forward_backward(placement: Placement, orders: list[list[Compute]], split: bool, budget=None,
                             pair=_pairs_forward_backward) -> list[list]:
    """Fuse neighbouring computations that `pair` accepts into one `Combined` action, each pair
    kept only if the planned step's bubble stays within `budget` (default: that of `orders`).

    Every pair at once first (one plan: 1F1B's pairs after the long warm-up always fit); only if
    that lengthens the step, pair by pair (one plan each: quadratic in the micro-batch count)."""
    budget = _plan_bubble(placement, orders, split) if budget is None else budget
    every = []
    for order in orders:
        out, i = [], 0
        while i < len(order):
            combined = pair(order[i], order[i + 1]) if i + 1 < len(order) else None
            out.append(combined or order[i])
            i += 2 if combined else 1
        every.append(out)
    try:
        if _plan_bubble(placement, every, split) <= budget:
            return every
    except InfeasibleOrder:
        pass
    fused = [list(order) for order in orders]
    for r in range(len(fused)):
        i = 0
        while i + 1 < len(fused[r]):
            a, b = fused[r][i], fused[r][i + 1]
            combined = pair(a, b) if isinstance(a, Compute) and isinstance(b, Compute) else None
            if combined is not None:
                trial = [list(o) for o in fused]
                trial[r][i:i + 2] = [combined]
                try:
                    if _plan_bubble(placement, trial, split) <= budget:
                        fused = trial
                except InfeasibleOrder:
                    pass
            i += 1
    return fused


def _has_combined(orders: list[list]) -> bool:
    return any(isinstance(a, Combined) for order in orders for a in order)


# ----------------------------------------------------------------------------- entry point
def _orders(spec: PipelineSpec, placement: Placement, m: int, warmup=None) -> list[list[Compute]]:
    """Every rank's F / B (/ W) order; `warmup(rank)` overrides 1F1B's warm-up length."""
    if spec.schedule == "zbv":
        return [zbv_order(placement, m, r) for r in range(spec.pp)]
    if spec.schedule == "1f1b" and warmup is not None:
        orders = [one_f_one_b_order(placement, m, r, warmup(r)) for r in range(spec.pp)]
    else:
        make = {"gpipe": gpipe_order, "1f1b": one_f_one_b_order, "interleaved_1f1b": interleaved_order}.get(spec.schedule)
        if make is None:
            raise ParallelConfigError(f"pipeline: no generator for schedule {spec.schedule!r}")
        orders = [make(placement, m, r) for r in range(spec.pp)]
    return zb_split_orders(placement, m, orders) if spec.split_backward else orders


def compute_orders(spec: PipelineSpec, microbatches: int) -> list[list]:
    """Every rank's compute order (Compute and, with overlap_b_f, Combined actions where a pair
    does not lengthen the planned step; see the module doc)."""
    spec.check_microbatches(microbatches)
    placement = Placement.of(spec)
    m = microbatches
    orders = _orders(spec, placement, m)
    if not spec.overlap_b_f:
        return orders
    budget = _plan_bubble(placement, orders, spec.split_backward)
    if spec.schedule == "interleaved_1f1b":
        fused = combine_forward_backward(placement, orders, spec.split_backward, budget)
    else:
        deeper = orders
        if spec.schedule == "1f1b":
            deeper = _orders(spec, placement, m, warmup=lambda r: 2 * (spec.pp - 1 - r))
        fused = combine_forward_backward(placement, deeper, spec.split_backward, budget, _pairs_backward_forward)
    return fused if _has_combined(fused) else orders


def overlap_b_f_idle_reason(schedule: Schedule) -> str:
    """Why `schedule` (built with overlap_b_f) has no forward and backward to run together."""
    if schedule.name == "gpipe":
        return "gpipe runs every forward before every backward"
    if schedule.name == "zbv":
        return "ZB-V follows each backward by its weight gradient, never by a forward"
    m = schedule.microbatches
    return (f"{schedule.name} with {m} micro-batch{'es' if m != 1 else ''} per step has no steady state in which a "
            "forward and a backward of other micro-batches could run together without lengthening the step")


def build_schedule(spec: PipelineSpec, microbatches: int) -> Schedule:
    """The action lists (computation and communication) of every pipeline rank for one step."""
    orders = compute_orders(spec, microbatches)
    placement = Placement.of(spec)
    ranks = place_communication(placement, orders, PLAN_COSTS, spec.split_backward)
    return Schedule(name=spec.schedule, pp=spec.pp, microbatches=microbatches, chunks=spec.chunks, style=spec.style,
                    split_backward=spec.split_backward, combined=_has_combined(orders),
                    ranks=tuple(tuple(r) for r in ranks), overlap_b_f=spec.overlap_b_f)
