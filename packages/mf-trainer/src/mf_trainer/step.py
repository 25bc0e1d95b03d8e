"""The compiled training step: forward, backward, global-norm clipping, skip-on-non-finite, AdamW.

Two shapes of step, both Cells that MindSpore compiles whole in GRAPH_MODE (or runs op by op in
PyNative):

* `FusedStep` (no gradient accumulation): one graph from the batch to the updated weights; the
  gradients never leave the graph.
* `AccumulateStep` + `ApplyStep` (accumulation > 1): each micro-batch adds its gradients into
  float32 buffers; once per global batch the apply graph clips, checks and updates, then zeroes
  the buffers.

Clipping follows torch's `clip_grad_norm_`: norm = sqrt(sum of squares of every gradient),
coef = max_norm / (norm + 1e-6), gradients scaled by min(coef, 1) (multiplying by exactly 1.0
when not clipping changes no bit). If the loss or the norm is NaN/Inf, nothing is updated (the
optimizer moments and step counter included; see `AdamW.construct` for how the skip is exact
without a graph `if`); the host counts such steps.

A loss cell with `has_aux = True` returns (loss, *extras): only the loss is differentiated; the
extras (e.g. a MoE model's balance loss and routing counts, mf_trainer/moe.py) come back from the
step, summed over micro-batches, in `StepResult.extras`.
"""

from __future__ import annotations

from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import ParameterTuple, Tensor, nn, ops

from mf_parallel import sum_of_squares

CLIP_EPS = 1e-6


def _global_norm(grads):
    total = sum_of_squares(grads[0])
    for i in range(1, len(grads)):
        total = total + sum_of_squares(grads[i])
    return ops.sqrt(total)


def _clip_or_zero(grads, norm, max_norm, finite):
    """Clipped gradients, or zeros when the step is skipped (NaN * 0 would still be NaN).

    The step's one flag picks the branch (a graph `if`: only the taken branch runs). A select per
    element (`ops.where(finite, g * coef, 0)`) gave the same values at twice the cost of the
    multiply: MindSpore's CPU Select is ~5x a Mul (27 ms of the 20M llama's step)."""
    coef = ops.minimum(max_norm / (norm + CLIP_EPS), 1.0)
    out = ()
    if finite:
        for g in grads:
            out = out + (g * coef,)
    else:
        for g in grads:
            out = out + (ops.zeros_like(g),)
    return out


class GradNorm(nn.Cell):
    """One process's global gradient norm (a parallel run passes mf-parallel's `GlobalNormClip`,
    whose `global_norm` counts every shard of every parameter exactly once over all ranks)."""

    def __init__(self, norm_cell: nn.Cell | None = None):
        super().__init__(auto_prefix=False)
        self.sharded = norm_cell is not None
        self.norm_cell = norm_cell

    def construct(self, grads):
        if self.sharded:
            return self.norm_cell.global_norm(grads)
        return _global_norm(grads)

    def parameter_norms(self, grads, positions):
        """The whole norm of each parameter at `positions` (indices into grads; -1: held by another
        rank only), as a float32 vector: `monitor.train_state.local_norm`."""
        if self.sharded:
            return self.norm_cell.parameter_norms(grads, positions)
        parts = ()
        for i in positions:
            if i >= 0:
                parts = parts + (sum_of_squares(grads[i]).reshape((1,)),)
            else:
                parts = parts + (ops.zeros((1,), ms.float32),)
        return ops.sqrt(ops.concat(parts))


class _NoSync(nn.Cell):
    def construct(self, grads):
        return grads


class FusedStep(nn.Cell):
    """(batch, scalars) -> (loss, grad norm before clipping, applied?, this rank's own grad norm
    [, the norms of the parameters at `positions`], *the loss cell's extras). `sync`: the parallel
    run's bucketed all-reduce of the gradients its plan left to the step (mf-parallel's
    `GradientSync`), applied first."""

    def __init__(self, loss_cell: nn.Cell, optimizer, max_norm: float, norm: GradNorm | None = None,
                 local_norm: bool = False, positions: tuple = (), sync: nn.Cell | None = None):
        super().__init__(auto_prefix=False)
        self.sync = sync if sync is not None else _NoSync()
        self.loss_cell = loss_cell
        self.optimizer = optimizer
        self.weights = optimizer.params
        self.max_norm = float(max_norm)
        self.has_aux = bool(getattr(loss_cell, "has_aux", False))
        self.grad_fn = ms.value_and_grad(loss_cell, None, self.weights, has_aux=self.has_aux)
        self.norm = norm or GradNorm()
        self.local_norm = local_norm
        self.positions = tuple(positions)

    def construct(self, labels, loss_mask, inv_tokens, lr, eps, decay, *model_inputs):
        out, grads = self.grad_fn(labels, loss_mask, inv_tokens, *model_inputs)
        loss, extras = (out[0], out[1:]) if self.has_aux else (out, ())
        grads = self.sync(grads)
        norm = self.norm(grads)
        finite = ops.logical_and(ops.isfinite(norm), ops.isfinite(loss))
        local = _global_norm(grads) if self.local_norm else norm
        # Before clipping, like grad_norm: what backward produced.
        per_param = (self.norm.parameter_norms(grads, self.positions),) if self.positions else ()
        grads = _clip_or_zero(grads, norm, self.max_norm, finite)
        self.optimizer(grads, finite, lr, eps, decay)
        return (loss, norm, finite, local) + per_param + extras


class AccumulateStep(nn.Cell):
    """(micro-batch) -> its share of the loss; gradients are added into `buffers`."""

    def __init__(self, loss_cell: nn.Cell, optimizer, buffers: ParameterTuple):
        super().__init__(auto_prefix=False)
        self.loss_cell = loss_cell
        self.weights = optimizer.params
        self.buffers = buffers
        self.has_aux = bool(getattr(loss_cell, "has_aux", False))
        self.grad_fn = ms.value_and_grad(loss_cell, None, self.weights, has_aux=self.has_aux)

    def construct(self, labels, loss_mask, inv_tokens, *model_inputs):
        out, grads = self.grad_fn(labels, loss_mask, inv_tokens, *model_inputs)
        for i in range(len(self.buffers)):
            ops.assign(self.buffers[i], self.buffers[i] + grads[i])
        return out


class ApplyStep(nn.Cell):
    """(total loss, scalars) -> (grad norm, applied?, this rank's own grad norm[, the norms of the
    parameters at `positions`]); syncs (`sync`, as FusedStep: once per step, after the
    micro-batches are added), clips, updates and zeroes the buffers."""

    def __init__(self, optimizer, buffers: ParameterTuple, max_norm: float, norm: GradNorm | None = None,
                 local_norm: bool = False, positions: tuple = (), sync: nn.Cell | None = None):
        super().__init__(auto_prefix=False)
        self.sync = sync if sync is not None else _NoSync()
        self.optimizer = optimizer
        self.buffers = buffers
        self.max_norm = float(max_norm)
        self.norm = norm or GradNorm()
        self.local_norm = local_norm
        self.positions = tuple(positions)

    def construct(self, loss, lr, eps, decay):
        grads = self.sync(tuple(self.buffers[i] * 1.0 for i in range(len(self.buffers))))
        norm = self.norm(grads)
        finite = ops.logical_and(ops.isfinite(norm), ops.isfinite(loss))
        local = _global_norm(grads) if self.local_norm else norm
        per_param = (self.norm.parameter_norms(grads, self.positions),) if self.positions else ()
        self.optimizer(_clip_or_zero(grads, norm, self.max_norm, finite), finite, lr, eps, decay)
        for i in range(len(self.buffers)):
            ops.assign(self.buffers[i], ops.zeros_like(self.buffers[i]))
        return (norm, finite, local) + per_param


def make_buffers(optimizer) -> ParameterTuple:
    """Zeroed float32 gradient buffers, one per trained parameter (names `grad_acc.<param>`)."""
    return optimizer.params.clone(prefix="grad_acc", init="zeros")


def loss_targets(mb: dict) -> tuple[Tensor, Tensor]:
    # int32 ids (what embedding lookups and gathers take on every backend), float32 mask.
    return (Tensor(np.ascontiguousarray(mb["labels"], dtype=np.int32)),
            Tensor(np.ascontiguousarray(mb["loss_mask"], dtype=np.float32)))


def batch_model_inputs(mb: dict) -> tuple[Tensor, ...]:
    """(input_ids[, position_ids[, attention_mask]]) in the model's positional order; a context-
    parallel micro-batch has segment_ids (global document ids) in the mask's place."""
    ids = np.ascontiguousarray(mb["input_ids"], dtype=np.int32)
    inputs = [Tensor(ids)]
    if "position_ids" in mb or "attention_mask" in mb or "segment_ids" in mb:
        positions = mb.get("position_ids")
        if positions is None:
            positions = np.broadcast_to(np.arange(ids.shape[1], dtype=np.int32), ids.shape)
        inputs.append(Tensor(np.ascontiguousarray(positions, dtype=np.int32)))
    if "attention_mask" in mb:
        # Megatron's convention, as mf-models takes it: True = masked out.
        inputs.append(Tensor(np.ascontiguousarray(mb["attention_mask"], dtype=np.bool_)))
    elif "segment_ids" in mb:
        inputs.append(Tensor(np.ascontiguousarray(mb["segment_ids"], dtype=np.int32)))
    return tuple(inputs)


@dataclass(frozen=True)
class StepResult:
    """What one optimizer step returns (host values)."""

    loss: float          # this rank's share of the global loss (x loss_scale); the caller adds the shares
    grad_norm: float     # the global gradient norm before clipping
    applied: bool        # False: a non-finite loss or norm, nothing was updated
    tokens: float        # loss-mask tokens of the global batch
    local_norm: float    # the norm of this rank's own gradients (the global one unless asked for)
    extras: tuple = ()   # a has_aux loss cell's extra outputs, summed over micro-batches (numpy)
    param_norms: tuple = ()   # the whole norm of each parameter at the runner's `positions` (floats)


class StepRunner:
    """Host side of one optimizer step over `micro_batches` (lists of numpy arrays).

    Computes 1 / tokens of the global batch, feeds the LR-dependent scalars, and returns a
    `StepResult`. `global_tokens(local count)` adds up the data-parallel ranks' loss-mask tokens,
    `loss_scale` multiplies 1 / tokens (the data-parallel size when FSDP averages gradients instead
    of summing them), `norm` is the global norm (mf-parallel's `GlobalNormClip`: every shard counted
    once; on one rank the one-process norm). `local_norm` also computes the norm of this rank's own
    gradients. `positions` (indices into optimizer.params) are the parameters whose own gradient
    norms each step returns too (`StepResult.param_norms`). `sync`: the bucketed all-reduce of the
    gradients a parallel plan left to the step (ParallelContext.gradient_sync), or None.
    """

    def __init__(self, loss_cell: nn.Cell, optimizer, max_norm: float, accumulation: int, *,
                 norm: GradNorm | None = None, local_norm: bool = False, global_tokens=None, loss_scale: int = 1,
                 positions: tuple = (), sync: nn.Cell | None = None):
        self.optimizer = optimizer
        self.accumulation = int(accumulation)
        self.global_tokens = global_tokens or (lambda tokens: tokens)
        self.loss_scale = int(loss_scale)
        if self.accumulation == 1:
            self.fused = FusedStep(loss_cell, optimizer, max_norm, norm, local_norm, positions, sync)
        else:
            self.buffers = make_buffers(optimizer)
            self.accumulate = AccumulateStep(loss_cell, optimizer, self.buffers)
            self.apply = ApplyStep(optimizer, self.buffers, max_norm, norm, local_norm, positions, sync)
        self.positions = tuple(positions)
        # A loss cell of a model with multi-token prediction takes 1 / tokens of each depth too
        # (mf_trainer/mtp.py): its inv_tokens is a [1 + depth] vector.
        self.mtp_depth = int(getattr(loss_cell, "mtp_depth", 0))

    def inverse_tokens(self, micro_batches: list[dict]) -> tuple[Tensor, float]:
        """(loss_scale / global tokens, as the loss cell takes it, and the global token count)."""
        if self.mtp_depth:
            from mf_trainer.mtp import inverse_tokens

            inv, tokens = inverse_tokens(micro_batches, self.global_tokens, self.loss_scale, self.mtp_depth)
            return Tensor(inv), tokens
        tokens = self.global_tokens(float(sum(float(mb["loss_mask"].sum()) for mb in micro_batches)))
        # A global batch whose every token is masked out has no loss; 1/0 would make NaN, which
        # the non-finite path then skips and counts, as it should.
        return Tensor(np.float32(self.loss_scale / tokens if tokens > 0 else np.inf)), tokens

    def cells(self) -> list[nn.Cell]:
        return [self.fused] if self.accumulation == 1 else [self.accumulate, self.apply]

    def compile(self, micro_batches: list[dict], lr: float) -> None:
        """Compile the step's graphs for these inputs without running them (GRAPH_MODE): the first
        call then runs the cached graph, so its time is a step's, not the compiler's."""
        mb = micro_batches[0]
        inv = Tensor(np.ones(1 + self.mtp_depth, np.float32) if self.mtp_depth else np.float32(1.0))
        scalars = self.optimizer.scalars(lr)
        if self.accumulation == 1:
            self.fused.compile(*loss_targets(mb), inv, *scalars, *batch_model_inputs(mb))
        else:
            self.accumulate.compile(*loss_targets(mb), inv, *batch_model_inputs(mb))
            self.apply.compile(Tensor(0.0, ms.float32), *scalars)

    def __call__(self, micro_batches: list[dict], lr: float) -> StepResult:
        inv, tokens = self.inverse_tokens(micro_batches)
        scalars = self.optimizer.scalars(lr)
        if self.accumulation == 1:
            mb = micro_batches[0]
            loss, norm, finite, local, *aux = self.fused(*loss_targets(mb), inv, *scalars, *batch_model_inputs(mb))
            per_param = aux.pop(0) if self.positions else None
            loss_value = float(loss.asnumpy())
            extras = tuple(a.asnumpy() for a in aux)
        else:
            loss_value, extras = 0.0, ()
            for mb in micro_batches:
                part = self.accumulate(*loss_targets(mb), inv, *batch_model_inputs(mb))
                if isinstance(part, (tuple, list)):
                    part, *aux = part
                    aux = [a.asnumpy() for a in aux]
                    extras = tuple(aux) if not extras else tuple(e + a for e, a in zip(extras, aux))
                loss_value += float(part.asnumpy())
            norm, finite, local, *per_param = self.apply(Tensor(loss_value, ms.float32), *scalars)
            per_param = per_param[0] if per_param else None
        applied = bool(finite.asnumpy())
        if applied:
            self.optimizer.step += 1
        return StepResult(loss_value, float(norm.asnumpy()), applied, tokens, float(local.asnumpy()), extras,
                          param_norms_of(per_param))


def param_norms_of(vector) -> tuple:
    """A step's per-parameter norm vector as host floats (() when none was asked for)."""
    return () if vector is None else tuple(float(v) for v in vector.asnumpy())
