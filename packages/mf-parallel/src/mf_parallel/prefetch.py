"""FSDP gather prefetch: the next unit's all-gathers are issued before the current unit computes.

Without it every FSDP leaf gathers its parameters right before it uses them, so on a backend that
launches work asynchronously (Ascend in PyNative: a communication stream beside the compute stream)
each gather still waits for the compute before it and the compute after it waits for the gather.
With it, when a unit (one `fully_shard` call: a decoder block, the root) starts, the gathers of the
unit that comes next are issued at once and their results kept until its leaves ask for them, so
they travel while this unit computes. The same happens in the backward for the gathers that
resharded units redo (`reshard_after_forward`): the unit whose backward comes next is gathered
while the current one differentiates. Two units' full parameters are alive at a time (FSDP2's
default of one unit ahead).

Each run's gathers travel as one collective (a bucket: the same shard group and dtype), as FSDP2's
flat all-gather does: one call per unit run instead of one per parameter.

How the order is known: the first pass of each phase (forward, backward) runs as before and
records which gather each leaf makes, in order; it ends when its first gather comes round again
(another leaf gathering twice in a pass does not end it).
From then on the recorded order, cut into runs of one unit, says what comes next. When a pass
deviates from it nothing goes wrong, only a prefetched gather may be thrown away (counted in
`wasted`): results are looked up by leaf and phase, never by position.

Why a kept result is never stale: parameters change only between steps (the optimizer) and every
step begins with the forward's first gather; that call drops everything kept. Prefetching is Python
run between ops, so it needs PyNative mode; a GRAPH_MODE graph's collective order is its
compiler's (`enable_gather_prefetch` refuses it). On a synchronous backend (CPU ranks) it changes
the order of the collectives and their count (fewer, larger calls), which is what the tests check.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mindspore as ms
from mindspore import nn, ops

from mf_parallel.errors import ParallelConfigError

log = logging.getLogger("mf_parallel")

PHASES = ("forward", "backward")


@dataclass
class GatherSource:
    """One prefetchable gather: the leaf parameter it gathers, its unit, and the collective."""

    label: str                       # "<leaf path>.<parameter>", for traces and messages
    unit: int                        # the owning fully_shard call
    shard: Any                       # the stored (sharded) Parameter
    issue: Callable[[Any], Any]      # the collective: shard -> gathered (padded) tensor
    bucket: Any = None               # gathers with equal keys may travel as one collective (group, dtype)


@dataclass
class _Phase:
    order: list[str] = field(default_factory=list)     # recorded gathers, first pass
    groups: list[list[str]] | None = None             # the order cut into runs of one unit
    group_of: dict[str, int] = field(default_factory=dict)
    ahead: int = 0                                     # groups up to this one are issued, this pass


class GatherPrefetcher:
    """Issues each phase's next unit of gathers ahead of use and hands the results to the leaves.

    `sources[phase][label]` are the gathers of that phase. `take(phase, label, shard)` is what a
    leaf's gather calls instead of the collective. `trace` (when `tracing`) lists
    ("issue" | "use", phase, label) in the order things happened: "use" is logged when the leaf
    receives its parameter, i.e. right before it computes with it.
    """

    def __init__(self, sources: dict[str, dict[str, GatherSource]], tracing: bool = False,
                 bucket_gather: Callable[[Any, list], list] | None = None) -> None:
        self.sources = sources
        self.bucket_gather = bucket_gather   # (bucket key, shards) -> their gathered tensors, one collective
        self.phases = {phase: _Phase() for phase in PHASES}
        self.kept: dict[tuple[str, str], Any] = {}
        self.tracing = tracing
        self.trace: list[tuple[str, str, str]] = []
        self.prefetched = 0     # gathers issued ahead of their use
        self.wasted = 0         # of those, dropped before use (a pass that left the recorded order)
        self.buckets = 0        # bucketed collectives issued (each replacing two or more gathers)

    # ------------------------------------------------------------------ what the leaves call
    def take(self, phase: str, label: str, shard):
        state = self.phases[phase]
        if state.groups is None:
            if label != (state.order[0] if state.order else None):
                if label not in state.order:   # a leaf may gather twice in a pass: recorded once
                    state.order.append(label)
                out = self._issue(phase, label, shard)
                self._log("use", phase, label)
                return out
            self._finish_recording(phase, state)
        group = state.group_of.get(label)
        if group == 0 and label == state.groups[0][0]:
            self._new_pass(phase, state)
        if group is not None and state.ahead <= group:
            # This run's gathers (one bucketed collective where they share a bucket), then the next
            # run's, before this leaf computes.
            state.ahead = group + 1
            self._issue_run(phase, [x for x in state.groups[group] if (phase, x) not in self.kept])
            if group + 1 < len(state.groups):
                ahead = [x for x in state.groups[group + 1] if (phase, x) not in self.kept]
                self._issue_run(phase, ahead)
                self.prefetched += len(ahead)
        out = self.kept.pop((phase, label), None)
        if out is None:
            out = self._issue(phase, label, shard)
        self._log("use", phase, label)
        return out

    # ------------------------------------------------------------------ internals
    def _issue(self, phase: str, label: str, shard):
        self._log("issue", phase, label)
        return self.sources[phase][label].issue(shard)

    def _issue_run(self, phase: str, labels: list[str]) -> None:
        """Gather `labels` into `kept`: one collective per bucket of two or more (`bucket_gather`),
        the others one by one (each from its stored shard: the value every leaf passes)."""
        buckets: dict[Any, list[tuple[str, Any]]] = {}
        for label in labels:
            source = self.sources[phase][label]
            buckets.setdefault(source.bucket, []).append((label, source.shard))
        for key, members in buckets.items():
            for label, _ in members:
                self._log("issue", phase, label)
            if key is not None and len(members) > 1 and self.bucket_gather is not None:
                outs = self.bucket_gather(key, [shard for _, shard in members])
                self.buckets += 1
            else:
                outs = [self.sources[phase][label].issue(shard) for label, shard in members]
            for (label, _), out in zip(members, outs):
                self.kept[(phase, label)] = out

    def _log(self, what: str, phase: str, label: str) -> None:
        if self.tracing:
            self.trace.append((what, phase, label))

    def _finish_recording(self, phase: str, state: _Phase) -> None:
        groups: list[list[str]] = []
        last_unit = None
        for label in state.order:
            unit = self.sources[phase][label].unit
            if unit != last_unit:
                groups.append([])
                last_unit = unit
            groups[-1].append(label)
        state.groups = groups
        state.group_of = {label: i for i, group in enumerate(groups) for label in group}
        log.info("FSDP gather prefetch (%s): %d gathers in %d unit runs recorded; from now on one unit ahead",
                 phase, len(state.order), len(groups))

    def _new_pass(self, phase: str, state: _Phase) -> None:
        """The phase's first gather again: a new pass. A new forward pass may follow an optimizer
        step, so it drops everything kept (both phases); a new backward pass drops its own phase's."""
        drop = [key for key in self.kept if phase == "forward" or key[0] == phase]
        for key in drop:
            del self.kept[key]
        self.wasted += len(drop)
        for name in PHASES if phase == "forward" else (phase,):
            self.phases[name].ahead = 0

    def reset(self) -> None:
        """Forget everything kept (call after changing parameters outside a training step)."""
        self.wasted += len(self.kept)
        self.kept.clear()
        for state in self.phases.values():
            state.ahead = 0


def gather_prefetch_pays_off(mode: int) -> bool:
    """Whether to prefetch: in PyNative (the only mode it works in), on every device. Where ops
    launch asynchronously the gathers overlap compute; everywhere a unit run's gathers travel as
    one collective instead of one per parameter (CPU ranks pay ~1 ms per collective call)."""
    return mode == ms.PYNATIVE_MODE


def _gather_flat(gather: nn.Cell, ranks: int, shards: list) -> list:
    """Every shard's gathered (padded) tensor from ONE all-gather of their flat concatenation: the
    same values as gathering each alone (rank r's shard is row block r of each result)."""
    flats = [ops.reshape(shard, (-1,)) for shard in shards]
    sizes = [int(flat.shape[0]) for flat in flats]
    gathered = gather(ops.concat(flats)).reshape((ranks, sum(sizes)))
    outs, offset = [], 0
    for shard, size in zip(shards, sizes):
        block = gathered[:, offset:offset + size]
        outs.append(block.reshape((ranks * int(shard.shape[0]),) + tuple(shard.shape[1:])))
        offset += size
    return outs


class _PrefetchedGather(nn.Cell):
    """Stands in for a leaf's all-gather Cell: asks the prefetcher (PyNative only)."""

    def __init__(self, prefetcher: GatherPrefetcher, phase: str, label: str) -> None:
        super().__init__()
        object.__setattr__(self, "_prefetcher", prefetcher)   # shared, not a sub-Cell
        self.phase = phase
        self.label = label

    def construct(self, shard):
        return self._prefetcher.take(self.phase, self.label, shard)


def enable_gather_prefetch(model: nn.Cell, tracing: bool = False) -> GatherPrefetcher:
    """Make every FSDP gather under `model` go through one prefetcher (see the module docstring).

    Call after `fully_shard` (and any strategy that rebuilds leaves), in PyNative mode. Gathers
    that move nothing (one-rank shard groups, 0-d parameters) are left alone. Returns the
    prefetcher (its `trace`, `prefetched` and `wasted` say what it did).
    """
    if ms.get_context("mode") != ms.PYNATIVE_MODE:
        raise ParallelConfigError("FSDP gather prefetch orders collectives from Python between ops, which needs "
                                  "PyNative mode (context.mode: 1); a compiled graph's order is its compiler's")
    from mf_parallel.collectives import AllGather
    from mf_parallel.fsdp import ShardGather
    from mf_parallel.leaf import plan_of

    sources: dict[str, dict[str, GatherSource]] = {phase: {} for phase in PHASES}
    swaps: list[tuple[nn.Cell, str, str, str]] = []
    groups: dict[tuple[str, str], Any] = {}
    for path, leaf in model.cells_and_names():
        plan = plan_of(leaf)
        core = getattr(leaf, "mf_core", None)
        if plan is None or plan.fsdp is None or core is None:
            continue
        for i, name in enumerate(plan.names):
            gather = core.pipes[i].gather
            if not isinstance(gather, ShardGather) or plan.fsdp.passes_param(name):
                continue
            if isinstance(gather.gather, _PrefetchedGather):
                raise ParallelConfigError(f"enable_gather_prefetch: {path}.{name} already goes through a prefetcher")
            label = f"{path}.{name}" if path else name
            shard = getattr(leaf, name)
            bucket = (plan.fsdp.shard_group.label, str(shard.dtype))
            groups[bucket] = plan.fsdp.shard_group
            sources["forward"][label] = GatherSource(label, plan.fsdp.unit, shard, gather.gather, bucket)
            swaps.append((gather, "gather", "forward", label))
            if core.reshard:
                sources["backward"][label] = GatherSource(label, plan.fsdp.unit, shard, gather.regather_op, bucket)
                swaps.append((gather, "regather_op", "backward", label))
    collectives: dict[tuple[str, str], nn.Cell] = {}

    def bucket_gather(bucket, shards):
        if bucket not in collectives:
            collectives[bucket] = AllGather(groups[bucket], 0)
        return _gather_flat(collectives[bucket], groups[bucket].size, shards)

    prefetcher = GatherPrefetcher(sources, tracing, bucket_gather)
    for gather, attr, phase, label in swaps:
        setattr(gather, attr, _PrefetchedGather(prefetcher, phase, label))
    log.info("FSDP gather prefetch on: %d forward and %d backward gathers, bucketed per unit run",
             len(sources["forward"]), len(sources["backward"]))
    return prefetcher
