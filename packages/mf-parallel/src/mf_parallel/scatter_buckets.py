"""FSDP gradient reduce-scatters bucketed per unit in PyNative: one collective per unit, not one per
parameter (the backward twin of the gather prefetcher's bucketing, prefetch.py).

Without it each FSDP leaf's backward reduce-scatters its own padded gradient as soon as it is made.
With it (`enable_gradient_buckets(model)`, PyNative only, after the plan and `defer_gradient_syncs`)
the leaf's backward deposits the padded gradient in its unit's bucket and hands autodiff a zero
shard gradient; when every leaf of the unit has deposited, the bucket travels as ONE reduce-scatter
of the rank-major concatenation of its gradients (each rank's rows of every gradient side by side,
as FSDP2's flat reduce-scatter lays them out), and each parameter's shard is cut out of the result,
divided and cast as its own reduce-scatter would have been. The step then adds the results to the
gradients autodiff returned (`bucketer.cell(params)`, applied by the Trainer with the deferred
all-reduces): elementwise the same sums as one reduce-scatter per parameter, so the same bits.

Deposits happen in the backward's order, the same on every rank, and a unit is flushed when all of
its leaves have deposited (or, for what is left, when the step collects): every rank issues the same
collectives in the same order. Only gathers whose replica all-reduce is left to the step (or that
have no replicas) take part; the others keep their own reduce-scatter. Not for the pipeline
executor, whose split backward runs weight gradients through the pipelines later (the Trainer
enables it without pipeline parallelism only).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import mindspore as ms
from mindspore import nn, ops

from mf_parallel.errors import ParallelConfigError

log = logging.getLogger("mf_parallel")


@dataclass
class _Member:
    key: tuple                   # (unit, leaf path, parameter name)
    param: Any                   # the stored shard Parameter
    gather: Any                  # its ShardGather (divide_by, cast, the dtypes)
    chunk: int                   # rows per rank


@dataclass
class _Bucket:
    group: Any
    members: list[_Member] = field(default_factory=list)
    pending: list[tuple[_Member, Any]] = field(default_factory=list)    # (member, padded gradient)


class GradientBucketer:
    """Collects the units' padded gradients and reduce-scatters each unit's in one collective."""

    def __init__(self) -> None:
        self.buckets: dict[tuple, _Bucket] = {}           # (unit, group label, dtype) -> bucket
        self.results: dict[int, Any] = {}                 # id(param) -> summed shard gradient
        self.flushes = 0                                  # bucketed collectives issued
        self.deposits = 0
        self._scatters: dict[str, nn.Cell] = {}

    def deposit(self, bucket_key: tuple, member: _Member, padded) -> None:
        bucket = self.buckets[bucket_key]
        bucket.pending.append((member, padded))
        self.deposits += 1
        if {id(m) for m, _ in bucket.pending} >= {id(m) for m in bucket.members}:
            self._flush(bucket)

    def _scatter(self, group):
        from mf_parallel.collectives import ReduceScatter

        if group.label not in self._scatters:
            self._scatters[group.label] = ReduceScatter(group, 0)
        return self._scatters[group.label]

    def _flush(self, bucket: _Bucket) -> None:
        if not bucket.pending:
            return
        n = bucket.group.size
        # Rank-major: row block r of the flat buffer holds rank r's rows of every gradient.
        rows = [ops.reshape(g, (n, -1)) for _, g in bucket.pending]
        flat = ops.concat(rows, 1).reshape(-1) if len(rows) > 1 else rows[0].reshape(-1)
        own = self._scatter(bucket.group)(flat)
        offset = 0
        for (member, padded), block in zip(bucket.pending, rows):
            width = int(block.shape[1])
            grad = own[offset:offset + width].reshape((member.chunk,) + tuple(padded.shape[1:]))
            offset += width
            gather = member.gather
            if gather.divide_by > 1:
                grad = grad / gather.divide_by
            if gather.cast:
                grad = ops.cast(grad, member.param.dtype)
            key = id(member.param)
            self.results[key] = grad if key not in self.results else self.results[key] + grad
        bucket.pending = []
        self.flushes += 1

    def flush_all(self) -> None:
        for bucket in self.buckets.values():
            self._flush(bucket)

    def take(self, params) -> list:
        """The bucketed shard gradients of `params` (None where there is none), forgetting them."""
        self.flush_all()
        out = [self.results.pop(id(p), None) for p in params]
        self.results.clear()
        return out

    def cell(self, params) -> nn.Cell:
        """The step's Cell: gradients aligned with `params` plus their bucketed shard gradients."""
        return _AddBucketed(self, list(params))


class _AddBucketed(nn.Cell):
    def __init__(self, bucketer: GradientBucketer, params: list) -> None:
        super().__init__()
        object.__setattr__(self, "_bucketer", bucketer)
        object.__setattr__(self, "_targets", params)

    def construct(self, grads):
        extra = self._bucketer.take(self._targets)
        return tuple(g if e is None else g + e for g, e in zip(grads, extra))


class _DepositScatter(nn.Cell):
    """Stands in for a ShardGather's reduce-scatter (PyNative): deposits the padded gradient and
    returns a zero shard; the bucket's collective makes the real one."""

    def __init__(self, bucketer: GradientBucketer, bucket_key: tuple, member: _Member) -> None:
        super().__init__()
        object.__setattr__(self, "_bucketer", bucketer)
        object.__setattr__(self, "_member", member)
        self.bucket_key = bucket_key

    def construct(self, padded):
        self._bucketer.deposit(self.bucket_key, self._member, padded)
        return ops.zeros((self._member.chunk,) + tuple(padded.shape[1:]), padded.dtype)


def enable_gradient_buckets(model: nn.Cell) -> GradientBucketer:
    """Bucket every eligible FSDP reduce-scatter under `model` by unit (see the module docstring).
    PyNative only; call after the plan and `defer_gradient_syncs`, before or after
    `enable_gather_prefetch`. The step must add `bucketer.cell(params)(grads)`."""
    if ms.get_context("mode") != ms.PYNATIVE_MODE:
        raise ParallelConfigError("FSDP gradient buckets collect gradients from Python between ops, which needs "
                                  "PyNative mode (context.mode: 1)")
    from mf_parallel.fsdp import ShardGather
    from mf_parallel.leaf import plan_of

    bucketer = GradientBucketer()
    swapped = 0
    for path, leaf in model.cells_and_names():
        plan = plan_of(leaf)
        core = getattr(leaf, "mf_core", None)
        if plan is None or plan.fsdp is None or core is None or plan.fsdp.shard_group.size == 1:
            continue
        for i, name in enumerate(plan.names):
            gather = core.pipes[i].gather
            if not isinstance(gather, ShardGather) or gather.replicated:
                continue
            if isinstance(gather.scatter, _DepositScatter):
                raise ParallelConfigError(f"enable_gradient_buckets: {path}.{name} is bucketed already")
            if plan.fsdp.replicate_group.size > 1 and not gather.defer_replicas:
                continue                     # its replica all-reduce follows the reduce-scatter
            param = getattr(leaf, name)
            key = (plan.fsdp.unit, plan.fsdp.shard_group.label, str(gather.reduce_dtype))
            bucket = bucketer.buckets.setdefault(key, _Bucket(plan.fsdp.shard_group))
            member = _Member((plan.fsdp.unit, path, name), param, gather, plan.fsdp.shards[name].chunk)
            bucket.members.append(member)
            gather.scatter = _DepositScatter(bucketer, key, member)
            swapped += 1
    log.info("FSDP gradient buckets on: %d reduce-scatters in %d unit buckets", swapped, len(bucketer.buckets))
    return bucketer
