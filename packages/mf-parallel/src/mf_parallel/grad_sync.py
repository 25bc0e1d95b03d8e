"""Gradient all-reduces deferred to the step and bucketed: one collective per group, not one per
parameter.

Two kinds of parameter gradient are all-reduced as they are made, one parameter at a time: the
replicated parameters of tensor parallelism (norm weights on sequence shards, a row-parallel bias
under SP, experts replicated over tp: `CopyToGroup` in the leaf's parameter pipeline, whose
backward all-reduces over tp) and, under HSDP / DDP, every sharded gradient over the replicas
(`ShardGather`'s backward). On CPU ranks every collective costs about a millisecond whatever its
size, so a step pays for each of them.

`defer_gradient_syncs(model)` turns those per-parameter all-reduces off in every planned leaf
under `model` (the gradients then leave the backward unsummed over those groups) and returns a
`DeferredSyncs` record; `record.cell(params)` is the `GradientSync` Cell the step must apply to
the gradients of `params` (aligned with them) before using them: per group, the gradients that
need it are flattened into one buffer, all-reduced once, and split back. Sums are linear, so the
result is the per-parameter one up to float summation order (and with gradient accumulation the
sync runs once per step, after the micro-batches are added). A step that forgets the Cell trains
on unsummed gradients: only call this where the step applies it (mf-trainer's StepRunner,
ApplyStep, the pipeline runner). Graph-compatible; call before the first compiled step.

Not deferred: a replica all-reduce whose gradient is cast back to a narrower parameter dtype after
the reduction (the bucket would sum in the narrow dtype), and 0-d parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mindspore import nn, ops

from mf_parallel.autograd import CopyToGroup
from mf_parallel.collectives import AllReduce
from mf_parallel.leaf import install, plan_of
from mf_parallel.mesh import Group


class DeferredSync(nn.Cell):
    """Stands in for `CopyToGroup` in a parameter pipeline: identity both ways (the step all-reduces
    the gradient, bucketed with the others: `GradientSync`)."""

    def construct(self, x):
        return x

    def backward(self, x, dout):
        return dout

    def bprop(self, x, out, dout):
        return (dout,)


@dataclass
class DeferredSyncs:
    """Which parameters' gradients the step must all-reduce over which groups (by id)."""

    groups: dict[str, Group] = field(default_factory=dict)            # label -> group
    members: dict[str, list] = field(default_factory=dict)            # label -> [Parameter] in model order

    def add(self, group: Group, param) -> None:
        self.groups.setdefault(group.label, group)
        members = self.members.setdefault(group.label, [])
        if not any(p is param for p in members):
            members.append(param)

    @property
    def count(self) -> int:
        return sum(len(v) for v in self.members.values())

    def cell(self, params) -> GradientSync:
        """The step's Cell for gradients aligned with `params` (parameters not listed: unchanged)."""
        index = {id(p): i for i, p in enumerate(params)}
        buckets = []
        for label, members in self.members.items():
            positions = tuple(index[id(p)] for p in members if id(p) in index)
            if positions:
                buckets.append((self.groups[label], positions))
        return GradientSync(buckets)


class GradientSync(nn.Cell):
    """grads -> grads with each bucket's entries all-reduced over its group in ONE collective (per
    bucket: the flattened gradients concatenated, reduced, split back, each reshaped).

    Where each gradient goes back is decided here, in Python (`slots`): compiled, every loop of
    `construct` is unrolled into nested calls, and a loop over the gradients with a loop over the
    bucket inside it nested (gradients x bucket) deep: the README's tiny demo under TP2 (42
    gradients, 9 deferred) passed GRAPH_MODE's call depth limit of 1000 and failed to compile.
    Now the depth is the bucket's size twice plus the gradients' count."""

    def __init__(self, buckets: list[tuple[Group, tuple[int, ...]]]) -> None:
        super().__init__()
        self.positions = tuple(tuple(positions) for _, positions in buckets)
        # slots[b][i]: which of bucket b's entries gradient i is (-1: not in the bucket)
        self.slots = tuple(tuple(positions.index(i) if i in positions else -1 for i in range(max(positions) + 1))
                           for positions in self.positions)
        self.reduces = nn.CellList([AllReduce(group) for group, _ in buckets])
        self.labels = tuple(group.label for group, _ in buckets)

    def construct(self, grads):
        for b in range(len(self.positions)):
            positions = self.positions[b]
            slots = self.slots[b]
            flat = ()
            for i in positions:
                flat = flat + (grads[i].reshape(-1),)
            summed = self.reduces[b](ops.concat(flat) if len(flat) > 1 else flat[0])
            parts = ()
            offset = 0
            for i in positions:             # the bucket's order, not the gradients'
                parts = parts + (summed[offset:offset + grads[i].size].reshape(grads[i].shape),)
                offset = offset + grads[i].size
            out = ()
            for i in range(len(grads)):
                if i < len(slots) and slots[i] >= 0:
                    out = out + (parts[slots[i]],)
                else:
                    out = out + (grads[i],)
            grads = out
        return grads


def defer_gradient_syncs(model: nn.Cell) -> DeferredSyncs:
    """Defer every per-parameter gradient all-reduce of the planned leaves under `model` to the
    step (see the module docstring); returns what the step must sync. Idempotent."""
    record = DeferredSyncs()
    for _, leaf in model.cells_and_names():
        plan = plan_of(leaf)
        if plan is None:
            continue
        changed = False
        for name in plan.names:
            param = getattr(leaf, name)
            sync = plan.grad_sync.get(name)
            if isinstance(sync, CopyToGroup) and sync.reduce.n > 1:
                plan.grad_sync[name] = DeferredSync()
                plan.deferred_sync[name] = sync.group
                changed = True
            group = plan.deferred_sync.get(name)
            if group is not None:
                record.add(group, param)
        fsdp = plan.fsdp
        if fsdp is not None and fsdp.replicate_group.size > 1:
            deferrable = [n for n in plan.names if not fsdp.shards[n].replicated
                          and getattr(leaf, n).dtype == fsdp.reduce_dtype]
            if deferrable and not fsdp.defer_replicas:
                fsdp.defer_replicas = True
                changed = True
            if fsdp.defer_replicas:
                for name in deferrable:
                    record.add(fsdp.replicate_group, getattr(leaf, name))
        if changed:
            install(leaf)
    return record

