"""Run one pipeline rank's action list: per-micro-batch forward and backward of its model chunks.

    executor = PipelineExecutor(schedule, chunks, mesh["pp"], tied=[table], tied_ranks=layout.tied_ranks)
    result = executor.step(micro_batches, loss_fn)   # result.loss, result.grads (aligned with .params)

The caller (the Trainer) owns everything around one optimizer step: it hands over this rank's
model chunks (by local chunk index), the micro-batches of the step and the loss function, and
gets back the summed gradients of every local parameter and the step's loss, so gradient
clipping and the optimizer continue unchanged. A chunk is any Cell with

    chunk(x, mb) -> output          x: the previous virtual stage's output (None on stage 0)
    chunk.input_spec(mb)  -> (shape, dtype) of x        (every stage but the first)
    chunk.output_spec(mb) -> (shape, dtype) of output   (every stage but the last)

and the last virtual stage's output goes through `loss_fn(output, mb) -> scalar`; the step's loss
is the sum of those scalars (normalise them by the global token count in `loss_fn`), returned on
every pipeline rank. mf-models builds such chunks from a CausalLM (`mf_models.pipeline_stage`).

Side outputs (a MoE stage's balance loss and routing counts): a chunk whose `side_outputs` is true
returns `(output, side_loss, *stats)`. `side_loss` (a scalar) is a term of the step's objective
that belongs to this chunk: it is added to the step's loss and differentiated in the chunk's own
backward (cotangent 1 beside the received output gradient), whichever stage the chunk is. `stats`
(Tensors) are not differentiated: they are summed over the micro-batches, per local chunk, into
`StepResult.stats` (taken from each micro-batch's forward, never from a backward's recompute).
`StepResult.side_loss` is the step's sum of side losses over every pipeline rank (`local_side_loss`:
this rank's chunks' share of it).

Backward through `mindspore.vjp`. MindSpore 2.10 keeps PyNative's recorded forwards as a stack:
a vjp function can only be called for the newest outstanding forward (measured: calling the
oldest first fails with "Can not find top cell for backward", and forwards without tensor inputs
silently return another micro-batch's gradients). Pipeline schedules differentiate the oldest
micro-batch first, so a forward whose backward is not this rank's very next computation runs
without recording and keeps only its input; its backward re-runs the chunk's forward under vjp
and differentiates it at once (full activation recomputation: one more forward per such
micro-batch and chunk, only stage inputs held in between). A forward followed directly by its
backward (the last stage of 1F1B) keeps its tape. Backward `B`: the vjp with the received output
gradient; its input gradient goes upstream, its weight gradients are added into float32
accumulators. With a split backward, linear weights' GEMMs are deferred (`weight_grad.py`) and
computed by the schedule's `W` actions, exactly. Messages: `p2p.PairChannel` per neighbour.

`pipeline_parallel_overlap_p2p`: on an asynchronous backend (HCCL/NCCL) the receives are issued
where the schedule places them (ahead of their use) and only their consumer waits; without it
the executor synchronises after every Comm. On CPU (MCCL) the emulated exchange blocks both ranks
and every op issued after it until both arrive (measured), so nothing can be issued ahead; the
executor says so once in the log. `pipeline_parallel_overlap_b_f`: the schedule's `Combined`
actions run their two parts (in the schedule's order) as one step whose messages travel together;
where the schedule found no pair, one log line says why.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mindspore as ms
from mindspore import ops

from mf_parallel.collectives import AllReduce
from mf_parallel.errors import ParallelConfigError
from mf_parallel.mesh import Group, make_group
from mf_parallel.pipeline.actions import Combined, Comm, Compute, Message, Schedule, computes
from mf_parallel.pipeline.dataflow import Costs
from mf_parallel.pipeline.p2p import PairChannel
from mf_parallel.pipeline.schedules import overlap_b_f_idle_reason
from mf_parallel.pipeline.stages import Placement
from mf_parallel.pipeline.weight_grad import WeightGradStash, defer_weight_grads

log = logging.getLogger("mf_parallel")
_LOGGED: set[str] = set()
_ONES_LIKE = ops.OnesLike()


def _once(key: str, message: str, *args) -> None:
    if key not in _LOGGED:
        _LOGGED.add(key)
        log.info(message, *args)


def _tapes_kept(actions) -> set[tuple]:
    """(mb, stage) of the forwards whose recorded tape can wait for their backward: those whose
    backward is this rank's next computation (weight-gradient GEMMs do not count: they record
    nothing). MindSpore keeps recorded forwards as a stack, so only the newest can be
    differentiated; every other backward recomputes its forward."""
    order = [c for a in actions for c in computes(a) if c.op != "W"]
    kept = set()
    for c, nxt in zip(order, order[1:]):
        if c.op == "F" and nxt.op == "B" and (nxt.mb, nxt.stage) == (c.mb, c.stage):
            kept.add((c.mb, c.stage))
    return kept


@dataclass
class StepResult:
    loss: float                                  # sum of the micro-batch losses, on every pipeline rank
    grads: tuple                                 # summed over the micro-batches, aligned with executor.params
    side_loss: float = 0.0                       # the chunks' side losses (part of `loss`), every pipeline rank
    local_side_loss: float = 0.0                 # ... of this rank's chunks only
    stats: tuple = ()                            # per local chunk: its side stats summed over micro-batches
    compute_seconds: float = 0.0                 # inside F / B / W
    comm_seconds: float = 0.0                    # inside Comms: waiting for the peer and moving data
    span_seconds: float = 0.0                    # first computation's start .. last one's end
    actions: list[tuple[Any, float, float]] = field(default_factory=list)   # (action, start, end), s from step start

    def stage_costs(self) -> dict[int, Costs]:
        """Mean seconds of this rank's F, B, W per local virtual stage, as simulator costs (a
        backward that recomputes its forward counts whole; unsplit, B is the whole backward)."""
        spans: dict[tuple[int, str], list[float]] = {}
        for action, start, end in self.actions:
            if isinstance(action, Compute):
                spans.setdefault((action.stage, action.op), []).append(end - start)
        out, tiny = {}, 1e-9                     # Costs must be positive; an unsplit step has no W
        for stage in sorted({s for s, _ in spans}):
            mean = {op: sum(v) / len(v) for (s, op), v in spans.items() if s == stage}
            out[stage] = Costs(mean.get("F", tiny), mean.get("B", tiny), mean.get("W", tiny))
        return out

    @property
    def idle_seconds(self) -> float:
        """Time between this rank's first and last computation spent not computing."""
        return self.span_seconds - self.compute_seconds


class PipelineExecutor:
    """Runs `schedule` for the pipeline rank `pp_group.rank` over its `chunks` (see the module doc).

    `tied` are local Parameters that other pipeline ranks hold a copy of (a tied embedding table:
    `StageLayout.tied_ranks`): their gradients are summed over those ranks after the backward.
    """

    def __init__(self, schedule: Schedule, chunks: Sequence, pp_group: Group, *, tied: Sequence = (),
                 tied_ranks: Sequence[int] = (), overlap_p2p: bool = False) -> None:
        if ms.get_context("mode") != ms.PYNATIVE_MODE:
            raise ParallelConfigError("parallelism.pipeline_parallel: the pipeline executor runs per micro-batch in "
                                      "PyNative mode (context.mode: 1)")
        if pp_group.size != schedule.pp:
            raise ParallelConfigError(f"pipeline executor: the schedule has {schedule.pp} stages but the pipeline group "
                                      f"{pp_group.label} has {pp_group.size} ranks")
        if len(chunks) != schedule.chunks:
            raise ParallelConfigError(f"pipeline executor: the schedule runs {schedule.chunks} chunk(s) per rank, "
                                      f"got {len(chunks)}")
        self.schedule = schedule
        self.chunks = list(chunks)
        self.group = pp_group
        self.rank = pp_group.rank
        self.placement = Placement(schedule.pp, schedule.chunks, schedule.style)
        self.actions = schedule.actions(self.rank)
        self.overlap_p2p = bool(overlap_p2p)
        self.stash = WeightGradStash()
        self.deferred = []
        if schedule.split_backward:
            for chunk in self.chunks:
                self.deferred += defer_weight_grads(chunk, self.stash)
        params, seen = [], set()
        for chunk in self.chunks:
            for p in chunk.trainable_params():
                if id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
        self.params = tuple(params)
        self._chunk_params = [tuple(c.trainable_params()) for c in self.chunks]
        self._side = [bool(getattr(c, "side_outputs", False)) for c in self.chunks]
        self._index = {id(p): i for i, p in enumerate(self.params)}
        # Every group this rank needs, created in one global order (every rank walks the same sorted
        # list and creates its own): safe where group creation is collective among the members.
        pairs = sorted({tuple(sorted((r, a.peer))) for r in range(schedule.pp) for a in schedule.actions(r)
                        if isinstance(a, Comm)})
        self.channels: dict[int, PairChannel] = {}
        for a, b in pairs:
            if self.rank in (a, b):
                peer = b if self.rank == a else a
                self.channels[peer] = PairChannel(pp_group.ranks[self.rank], pp_group.ranks[peer])
        self.tied = tuple(tied) if self.rank in tied_ranks and len(set(tied_ranks)) > 1 else ()
        for p in self.tied:
            if id(p) not in self._index:
                raise ParallelConfigError(f"pipeline executor: tied parameter {p.name} is not a parameter of the chunks")
        self.tied_sum = (AllReduce(make_group("pp_tied", [pp_group.ranks[r] for r in sorted(set(tied_ranks))]))
                         if self.tied else None)
        self.loss_sum = AllReduce(pp_group)
        self.keep_tape = _tapes_kept(self.actions)
        self.device = ms.get_context("device_target")
        self._explain_flags(schedule)

    # ------------------------------------------------------------------------------------- logging
    def _explain_flags(self, schedule: Schedule) -> None:
        native = all(c.native for c in self.channels.values()) if self.channels else True
        backend = self.group.backend
        _once("schedule", "pipeline: %s; rank %d runs %d actions (%d p2p exchanges)", schedule.describe(), self.rank,
              len(self.actions), sum(isinstance(a, Comm) for a in self.actions))
        if self.overlap_p2p:
            if native:
                _once("overlap_p2p", "pipeline_parallel_overlap_p2p: receives are issued where the schedule places "
                      "them, ahead of their use, and waited for only by the computation that consumes them (%s)",
                      backend)
            else:
                _once("overlap_p2p", "pipeline_parallel_overlap_p2p on %s: changes nothing here. p2p is emulated by an "
                      "all-reduce of the two ranks, which blocks both ranks and every op issued after it until both "
                      "arrive (measured on MindSpore 2.10.0 CPU), so a send or receive cannot be issued ahead of its "
                      "use: every exchange runs, blocking, where the schedule places it (on HCCL/NCCL the receives "
                      "are issued ahead and waited for only where consumed)", backend)
        if schedule.combined:
            every = [a for rank in schedule.ranks for a in rank if isinstance(a, Combined)]
            mine = sum(isinstance(a, Combined) for a in self.actions)
            kind = ("a backward and the forward of a later micro-batch after it" if every[0].backward_first
                    else "the forward of one chunk and the backward of another")
            what = (f"{len(every)} pair{'s' if len(every) != 1 else ''} ({kind}; {mine} on this rank) run as one "
                    "combined action each, their messages sent together after the pair")
            if native:
                _once("overlap_b_f", "pipeline_parallel_overlap_b_f: %s", what)
            else:
                _once("overlap_b_f", "pipeline_parallel_overlap_b_f on %s: %s; what it cannot change here: the two "
                      "parts run one after the other and no communication overlaps them, because computation and the "
                      "emulated p2p run one at a time on CPU", backend, what)
        elif schedule.overlap_b_f:
            _once("overlap_b_f", "pipeline_parallel_overlap_b_f: changes nothing in this layout, %s; the schedule runs "
                  "as without it", overlap_b_f_idle_reason(schedule))

    # ------------------------------------------------------------------------------------- one step
    def step(self, microbatches: Sequence[Any], loss_fn: Callable[[Any, Any], Any]) -> StepResult:
        """Run this rank's actions over `microbatches` (the step's, in order; every pipeline rank
        passes the same ones); returns the summed gradients of `self.params` and the step's loss."""
        if len(microbatches) != self.schedule.microbatches:
            raise ParallelConfigError(f"pipeline executor: the schedule is for {self.schedule.microbatches} "
                                      f"micro-batches, got {len(microbatches)}")
        self.mbs, self.loss_fn = list(microbatches), loss_fn
        self.acc: list[Any] = [None] * len(self.params)
        self.tapes: dict[tuple, Any] = {}
        self.inbox: dict[tuple, Any] = {}
        self.outbox: dict[tuple, Any] = {}
        self.losses: list[Any] = []
        self.side_losses: list[Any] = []
        self.stats: list[Any] = [None] * len(self.chunks)
        self.stash.clear()
        result = StepResult(loss=0.0, grads=())
        start = time.perf_counter()
        first = last = None
        for action in self.actions:
            t0 = time.perf_counter()
            if isinstance(action, Comm):
                self._comm(action)
            else:
                for part in computes(action):
                    self._compute(part)
                self._sync()
            t1 = time.perf_counter()
            if isinstance(action, Comm):
                result.comm_seconds += t1 - t0
            else:
                result.compute_seconds += t1 - t0
                first = t0 if first is None else first
                last = t1
            result.actions.append((action, t0 - start, t1 - start))
        leftovers = {name: len(d) for name, d in (("activations", self.tapes), ("received", self.inbox),
                                                    ("unsent", self.outbox)) if d}
        if leftovers or len(self.stash):
            raise ParallelConfigError(f"pipeline executor: the step ended holding {leftovers or ''} "
                                      f"{len(self.stash)} deferred weight gradients (a schedule bug)")
        grads = [g if g is not None else ops.zeros(p.shape, ms.float32) for g, p in zip(self.acc, self.params)]
        for p in self.tied:
            i = self._index[id(p)]
            grads[i] = self.tied_sum(grads[i])
        # One all-reduce of (loss, side loss): every pipeline rank gets the step's totals.
        local = ms.Tensor([sum(float(x.asnumpy()) for x in self.losses),
                           sum(float(x.asnumpy()) for x in self.side_losses)], ms.float32)
        total = (self.loss_sum(local) if self.group.size > 1 else local).asnumpy()
        result.loss, result.side_loss = float(total[0]), float(total[1])
        result.local_side_loss = float(local.asnumpy()[1])
        result.grads = tuple(grads)
        result.stats = tuple(() if s is None else tuple(s) for s in self.stats)
        result.span_seconds = (last - first) if first is not None else 0.0
        self.mbs, self.losses, self.side_losses = [], [], []
        return result

    # ------------------------------------------------------------------------------------- forward only
    def forward(self, microbatches: Sequence[Any], out_fn: Callable[[Any, Any], Any], size: int):
        """Forward only (evaluation): every micro-batch through the virtual stages in order, no tape,
        no gradient, any number of micro-batches (the schedule's count is the training step's).
        `out_fn(last stage output, mb)` -> float32 Tensor [size] on the rank of the last virtual
        stage; returns the sum over the micro-batches, all-reduced over the pipeline group, so
        every pipeline rank gets it (a float32 Tensor [size]).

        Order: micro-batch by micro-batch, stage by stage, each activation exchanged between the
        two ranks of its boundary at once. Every rank walks the same global sequence and joins only
        the exchanges it is part of, so the blocking pairwise exchanges cannot deadlock; a stage
        waits for the previous one (a GPipe-like fill without the overlap: evaluation is a few
        batches, simplicity over throughput)."""
        stages = self.placement.virtual_stages
        total = None
        for mb in microbatches:
            held = None                                    # this rank's activation of the current stage
            for stage in range(stages):
                owner = self.placement.rank_of(stage)
                if owner == self.rank:
                    _, chunk = self.placement.owner(stage)
                    out = self.chunks[chunk](held, mb)
                    if self._side[chunk]:
                        out = out[0]                       # evaluation: no balance loss, no routing counts
                    if stage == stages - 1:
                        part = ops.cast(out_fn(out, mb), ms.float32)
                        total = part if total is None else total + part
                    held = out
                if stage == stages - 1:
                    break
                nxt = self.placement.rank_of(stage + 1)
                if owner == nxt or self.rank not in (owner, nxt):
                    if self.rank not in (owner, nxt):
                        held = None
                    continue
                key = ("act", stage)
                if self.rank == owner:
                    self.channels[nxt].exchange([(key, held)], [], [key])
                    held = None
                else:
                    _, chunk = self.placement.owner(stage + 1)
                    shape, dtype = self.chunks[chunk].input_spec(mb)
                    held = self.channels[owner].exchange([], [(key, shape, dtype)], [key])[key]
                self._sync()
        if total is None:
            total = ops.zeros((size,), ms.float32)
        return self.loss_sum(total) if self.group.size > 1 else total

    # ------------------------------------------------------------------------------------- computations
    def _compute(self, c: Compute) -> None:
        if c.op == "F":
            self._forward(c)
        elif c.op == "B":
            self._backward(c)
        else:
            for p, dw in self.stash.apply((c.mb, c.stage)):
                self._accumulate(p, dw)

    def _run_fn(self, c: Compute):
        """The function differentiated for (c.mb, c.stage): the stage output (the loss on the last
        stage); with side outputs `((output, side_loss) | loss + side_loss, (side_loss, *stats))`,
        the second part returned beside the gradient (vjp's has_aux)."""
        chunk, mb = self.chunks[c.chunk], self.mbs[c.mb]
        last = c.stage == self.placement.virtual_stages - 1
        side = self._side[c.chunk]

        def run(*xs):
            out = chunk(xs[0] if xs else None, mb)
            if not side:
                return self.loss_fn(out, mb) if last else out
            out, side_loss, *stats = out
            value = self.loss_fn(out, mb) + side_loss if last else (out, side_loss)
            return value, (side_loss, *stats)

        return run

    def _vjp(self, c: Compute, inputs):
        """(value, vjp_fn, side outputs or None) of (c.mb, c.stage) under a recorded tape."""
        if self._side[c.chunk]:
            return ms.vjp(self._run_fn(c), *inputs, weights=self._chunk_params[c.chunk], has_aux=True)
        return (*ms.vjp(self._run_fn(c), *inputs, weights=self._chunk_params[c.chunk]), None)

    def _record_side(self, c: Compute, side) -> None:
        """A forward's side loss (a term of the step's loss) and its stats, summed per chunk."""
        side_loss, *stats = side
        self.side_losses.append(side_loss)
        held = self.stats[c.chunk]
        self.stats[c.chunk] = stats if held is None else [a + b for a, b in zip(held, stats)]

    def _forward(self, c: Compute) -> None:
        last = c.stage == self.placement.virtual_stages - 1
        inputs = () if c.stage == 0 else (self.inbox.pop(("act", c.mb, c.stage - 1)),)
        if (c.mb, c.stage) in self.keep_tape:
            out, vjp_fn, side = self._vjp(c, inputs)
            self.tapes[(c.mb, c.stage)] = (vjp_fn, out)
        else:
            out = self._run_fn(c)(*inputs)       # no tape: the backward recomputes (see the module doc)
            out, side = out if self._side[c.chunk] else (out, None)
            self.tapes[(c.mb, c.stage)] = (None, inputs)
        if side is not None:
            self._record_side(c, side)
        if last:
            self.losses.append(out)
            return
        if side is not None:
            self.losses.append(out[1])           # this stage's side loss is a term of the step's loss
            out = out[0]
        key = ("act", c.mb, c.stage)
        if self.placement.rank_of(c.stage + 1) == self.rank:
            self.inbox[key] = out
        else:
            self.outbox[key] = out

    def _backward(self, c: Compute) -> None:
        vjp_fn, held = self.tapes.pop((c.mb, c.stage))
        if vjp_fn is None:
            out, vjp_fn, _ = self._vjp(c, held)  # the recompute's side outputs were counted by the forward
        else:
            out = held
        last = c.stage == self.placement.virtual_stages - 1
        dy = _ONES_LIKE(out) if last else self.inbox.pop(("grad", c.mb, c.stage))
        if self._side[c.chunk] and not last:
            dy = (dy, _ONES_LIKE(out[1]))        # the side loss's own cotangent
        if self.schedule.split_backward:
            with self.stash.collect((c.mb, c.stage)):
                input_grads, weight_grads = vjp_fn(dy)
        else:
            input_grads, weight_grads = vjp_fn(dy)
        for p, g in zip(self._chunk_params[c.chunk], weight_grads):
            self._accumulate(p, g)
        if c.stage == 0:
            return
        key = ("grad", c.mb, c.stage - 1)
        if self.placement.rank_of(c.stage - 1) == self.rank:
            self.inbox[key] = input_grads[0]
        else:
            self.outbox[key] = input_grads[0]

    def _accumulate(self, p, g) -> None:
        i = self._index[id(p)]
        g = ops.cast(g, ms.float32)
        self.acc[i] = g if self.acc[i] is None else self.acc[i] + g

    # ------------------------------------------------------------------------------------- messages
    def _spec(self, msg: Message) -> tuple:
        """(shape, dtype) of an incoming message, from the local chunk that consumes it."""
        mb = self.mbs[msg.mb]
        if msg.kind == "act":
            _, chunk = self.placement.owner(msg.boundary + 1)
            return self.chunks[chunk].input_spec(mb)
        _, chunk = self.placement.owner(msg.boundary)
        return self.chunks[chunk].output_spec(mb)

    def _comm(self, comm: Comm) -> None:
        channel = self.channels[comm.peer]
        keys = {m: (m.kind, m.mb, m.boundary) for m in (*comm.sends, *comm.recvs)}
        sends = [(keys[m], self.outbox.pop(keys[m])) for m in comm.sends]
        recvs = [(keys[m], *self._spec(m)) for m in comm.recvs]
        order = [keys[m] for m in sorted(keys)]
        got = channel.exchange(sends, recvs, order)
        self.inbox.update(got)
        if not (self.overlap_p2p and channel.native):
            self._sync()

    def _sync(self) -> None:
        """Wait for the queued ops (timings, and p2p completion without overlap). On CPU PyNative
        runs ops synchronously under `pynative_synchronize` (the Trainer's setting) and
        `runtime.synchronize` has no CPU implementation."""
        if self.device != "CPU":
            ms.runtime.synchronize()
