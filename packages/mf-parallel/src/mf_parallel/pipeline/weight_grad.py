"""The dx / dw split of a backward: linear layers whose weight-gradient GEMM can be deferred.

Zero-bubble schedules run a backward in two parts: B computes the gradient of a chunk's input (it
is on the critical path: the previous stage waits for it), W the gradients of its weights (it can
wait, and fills the pipeline's bubbles). Almost all of W is the weight GEMM of each linear layer,
dW = dout^T x; the rest (norm weights, biases, embedding rows) is cheap and stays in B.

`defer_weight_grads(cell, stash)` gives every linear leaf under `cell` whose class has a
registered split rule (`register_weight_grad_split`; mf-parallel registers mint.nn.Linear, a model
registers its own) a custom backward: its input gradient (and bias gradient) always run at once;
its weight gradient runs at once too, unless `stash.collect(key)` is active, in which case the
leaf records (x, dout) under `key` and returns a zero weight gradient, and `stash.apply(key)`
computes the recorded GEMMs later. Both paths call the same rule functions on the same tensors,
so a deferred weight gradient is bit for bit the gradient of the unsplit backward (the tests
compare them, and both against MindSpore's own autodiff).

PyNative only: the custom backward runs as Python, which is what lets it defer work.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import mindspore as ms
from mindspore import nn, ops

from mf_parallel.errors import ParallelConfigError
from mf_parallel.leaf import ensure_plan, install, plan_of

_ZEROS_LIKE = ops.ZerosLike()


@dataclass(frozen=True)
class WeightGradSplit:
    """`input_grad(cell, weight, bias, x, dout) -> (dx, dbias or None)` and
    `weight_grad(cell, weight, bias, x, dout) -> dweight`; `weight`, `bias` as the leaf's parameter
    forward receives them (bias None when absent), `x` the leaf's input, `dout` its output grad."""

    input_grad: Callable[..., Any]
    weight_grad: Callable[..., Any]


_SPLITS: dict[type, WeightGradSplit] = {}


def register_weight_grad_split(cls: type, input_grad: Callable[..., Any], weight_grad: Callable[..., Any]) -> None:
    """Declare how a linear leaf class splits its backward (see `WeightGradSplit`). The class must
    also have a parameter forward taking ("weight", "bias") (see `register_param_forward`)."""
    if not isinstance(cls, type) or not issubclass(cls, nn.Cell):
        raise ParallelConfigError(f"register_weight_grad_split: {cls!r} is not a mindspore.nn.Cell subclass")
    _SPLITS[cls] = WeightGradSplit(input_grad, weight_grad)


def split_of(cell: nn.Cell) -> WeightGradSplit | None:
    """The split rule of `cell`'s class (a planned leaf's dynamic class inherits its base's)."""
    for klass in type(cell).__mro__:
        if klass in _SPLITS:
            return _SPLITS[klass]
    return None


# mint.nn.Linear (y = x W^T + b), registered here; its parameter forward is mf-parallel's.
def _mint_linear_input_grad(cell, weight, bias, x, dout):
    d2 = dout.reshape(-1, dout.shape[-1])
    dx = ops.MatMul()(d2, weight).reshape(x.shape)
    return dx, (d2.sum(0) if bias is not None else None)


def _mint_linear_weight_grad(cell, weight, bias, x, dout):
    return ops.MatMul(transpose_a=True)(dout.reshape(-1, dout.shape[-1]), x.reshape(-1, x.shape[-1]))


register_weight_grad_split(ms.mint.nn.Linear, _mint_linear_input_grad, _mint_linear_weight_grad)


class WeightGradStash:
    """Deferred weight GEMMs, by key (e.g. (micro-batch, virtual stage))."""

    def __init__(self) -> None:
        self.active: Any = None
        self._records: dict[Any, list] = defaultdict(list)

    @contextmanager
    def collect(self, key: Any):
        """Within this block, deferring leaves record their weight GEMM under `key`."""
        if self.active is not None:
            raise ParallelConfigError(f"weight-gradient stash: already collecting for {self.active!r}")
        self.active = key
        try:
            yield
        finally:
            self.active = None

    def record(self, leaf: nn.Cell, rule: WeightGradSplit, weight, bias, x, dout) -> None:
        self._records[self.active].append((leaf, rule, weight, bias, x, dout))

    def pending(self, key: Any) -> int:
        return len(self._records.get(key, ()))

    def apply(self, key: Any) -> list[tuple[Any, Any]]:
        """Run the GEMMs recorded under `key`: [(the leaf's weight Parameter, its gradient)], in the
        order the backward met the leaves (a leaf used twice contributes twice). Each gradient then
        goes through the adjoint of the leaf's weight pipeline, as the unsplit backward's would:
        the FSDP reduce-scatter to the stored shard (and the replica all-reduce), a TP gradient
        sync. Every rank of those groups runs the same schedule, so they meet in the same W."""
        out = []
        for leaf, rule, weight, bias, x, dout in self._records.pop(key, []):
            grad = rule.weight_grad(leaf, weight, bias, x, dout)
            pipe = _weight_pipeline(leaf)
            out.append((leaf.weight, grad if pipe is None else pipe.backward(leaf.weight, grad)))
        return out

    def clear(self) -> None:
        self._records.clear()
        self.active = None

    def __len__(self) -> int:
        return sum(len(v) for v in self._records.values())


class _SplitLinear(nn.Cell):
    """out = the leaf's parameter forward; backward per `WeightGradSplit`, the weight part
    possibly deferred into the stash."""

    def __init__(self, leaf: nn.Cell, fn, rule: WeightGradSplit, stash: WeightGradStash) -> None:
        super().__init__()
        object.__setattr__(self, "_leaf", leaf)      # a reference, not a sub-Cell
        object.__setattr__(self, "_stash", stash)
        self.fn = fn
        self.rule = rule

    def forward_of(self, weight, bias, x):
        return self.fn(self._leaf, weight, bias, x)

    def backward_of(self, weight, bias, x, dout):
        dx, dbias = self.rule.input_grad(self._leaf, weight, bias, x, dout)
        if self._stash.active is None:
            dweight = self.rule.weight_grad(self._leaf, weight, bias, x, dout)
        else:
            self._stash.record(self._leaf, self.rule, weight, bias, x, dout)
            dweight = _ZEROS_LIKE(weight)
        return dweight, dbias, dx


class _SplitLinearBias(_SplitLinear):
    def construct(self, weight, bias, x):
        return self.forward_of(weight, bias, x)

    def bprop(self, weight, bias, x, out, dout):
        return self.backward_of(weight, bias, x, dout)


class _SplitLinearNoBias(_SplitLinear):
    def construct(self, weight, x):
        return self.forward_of(weight, None, x)

    def bprop(self, weight, x, out, dout):
        dweight, _, dx = self.backward_of(weight, None, x, dout)
        return dweight, dx


def _split_forward(cell, weight, bias, x):
    if bias is None:
        return cell.mf_wgrad_split(weight, x)
    return cell.mf_wgrad_split(weight, bias, x)


def _weight_pipeline(leaf: nn.Cell):
    """The leaf's weight pipeline (FSDP gather, TP gradient sync) whose adjoint the deferred
    gradient still needs, or None when the weight is used as stored."""
    plan = plan_of(leaf)
    if plan is None or (plan.fsdp is None and "weight" not in plan.grad_sync):
        return None
    return leaf.mf_core.pipes[plan.names.index("weight")]


def defer_weight_grads(cell: nn.Cell, stash: WeightGradStash) -> list[nn.Cell]:
    """Give every linear leaf under `cell` with a registered split rule the deferrable backward
    (see the module docstring); returns those leaves. Apply after tensor parallelism and FSDP: an
    FSDP leaf's B reduce-scatters a zero weight gradient (the unsplit backward's collective, so the
    ranks of the shard group stay in step), and its W reduce-scatters the deferred one."""
    if ms.get_context("mode") != ms.PYNATIVE_MODE:
        raise ParallelConfigError("parallelism.pipeline_parallel_enable_dxdw_split: the deferred weight gradient runs "
                                  "as Python in the backward, which needs PyNative mode (context.mode: 1)")
    done = []
    for _, leaf in cell.cells_and_names():
        rule = split_of(leaf)
        if rule is None or not leaf._params:
            continue
        plan = plan_of(leaf)
        if plan is not None and plan.fn is _split_forward:
            done.append(leaf)
            continue
        plan = ensure_plan(leaf)
        if plan.forward.param_names[:2] != ("weight", "bias"):
            raise ParallelConfigError(f"defer_weight_grads: {type(leaf).__qualname__} must take ('weight', 'bias')")
        # A row-parallel bias is added after the output's reduction (plan.deferred): the parameter
        # forward gets None for it, so the split runs without bias and the bias keeps its own path.
        has_bias = "bias" in plan.names and "bias" not in plan.deferred
        split_cls = _SplitLinearBias if has_bias else _SplitLinearNoBias
        leaf.mf_wgrad_split = split_cls(leaf, plan.fn, rule, stash)
        plan.fn = _split_forward
        install(leaf)
        done.append(leaf)
    return done
