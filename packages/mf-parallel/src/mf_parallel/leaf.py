"""Leaf rewriting: how strategies change the way a parameter-owning Cell uses its parameters.

A *leaf* is a Cell that owns Parameters directly (a Linear, an Embedding, a norm). Strategies must
run code between the stored parameter and its use: FSDP gathers a shard into the full tensor, TP
with sequence parallelism all-reduces the gradient of a replicated norm weight. MindSpore's graph
compiler reads `self.weight` in `construct` straight from the Cell, so the only way that works in
both PyNative and GRAPH_MODE is to give the leaf a new `construct` that takes its parameters as
tensors and calls a *parameter forward*: a pure function `fn(cell, *params, *inputs)`.

So each leaf type registers its parameter forward once (`register_param_forward`); mf-parallel
registers mindspore.mint.nn.Linear, mindspore.nn.Dense and mindspore.nn.Embedding, and a model
registers its own norm classes. A transformed leaf keeps its class (a dynamic subclass), its
attribute names and therefore its parameter names, so checkpoints and optimizer states keep the
model's names.

Every transform edits one `LeafPlan` per leaf and re-installs the leaf's `mf_core` Cell:
  inputs -> input transform (activation collective) -> parameter pipelines (FSDP gather, TP grad
  sync) -> parameter forward -> output transform -> + deferred bias
When FSDP reshards after forward, gather + parameter forward run inside `_Recompute`, whose bprop
gathers again instead of keeping the full parameters alive between forward and backward. With
`regather_input` (recompute_comm: a column-parallel leaf fed the sequence shard) the input's
all-gather runs inside `_Recompute` too: backward gathers the shard again instead of keeping the
full-sequence input the weight gradient needs (Megatron's sequence-parallel linear does the same).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mindspore import mint, nn, ops

from mf_parallel.errors import ParallelConfigError


@dataclass(frozen=True)
class ParamForward:
    param_names: tuple[str, ...]
    fn: Callable[..., Any]


_FORWARDS: dict[type, ParamForward] = {}


# fn(cell, *params, x) -> ((x_t, w_t), ...) with the leaf's output = sum_t x_t @ w_t^T
_TERMS: dict[type, Callable[..., Any]] = {}


def register_param_forward(cls: type, param_names: tuple[str, ...] | list[str], fn: Callable[..., Any]) -> None:
    """Declare how `cls` computes its output from its parameters.

    `fn(cell, *params, *inputs)` receives the parameters named `param_names` in that order (None
    for one the instance lacks, e.g. a Linear without bias) and must not read them from `cell`
    (it may read other attributes, such as `cell.eps`). Define `fn` at module level in a source
    file: GRAPH_MODE compiles it.
    """
    if not isinstance(cls, type) or not issubclass(cls, nn.Cell):
        raise ParallelConfigError(f"register_param_forward: {cls!r} is not a mindspore.nn.Cell subclass")
    _FORWARDS[cls] = ParamForward(tuple(param_names), fn)


def register_linear_terms(cls: type, fn: Callable[..., Any]) -> None:
    """Declare `cls`'s output as a sum of linear terms, so a fused projection + loss
    (`LinearCrossEntropy`) can take its input and weights instead of its output, also once a plan
    has rewritten it (TP slices, FSDP gathers: `cell.linear_terms(x)` then runs the leaf's input
    transform and parameter pipelines, and the terms of the parameters they produce).

    `fn(cell, *params, x)` receives the parameters as the registered parameter forward does and
    returns `((x_t, w_t), ...)` with forward(x) == sum_t x_t @ w_t^T. Define it at module level in
    a source file: GRAPH_MODE compiles it.
    """
    if not isinstance(cls, type) or not issubclass(cls, nn.Cell):
        raise ParallelConfigError(f"register_linear_terms: {cls!r} is not a mindspore.nn.Cell subclass")
    _TERMS[cls] = fn


def linear_terms_of(cell: nn.Cell) -> Callable[..., Any] | None:
    for klass in type(cell).__mro__:
        if klass in _TERMS:
            return _TERMS[klass]
    return None


def linear_terms_problem(cell: nn.Cell) -> str | None:
    """Why `cell.linear_terms(x)` cannot stand in for `cell(x)` (None when it can): a planned leaf
    needs registered terms, no output transform (e.g. logits gathered over tp) and no bias."""
    plan = plan_of(cell)
    if plan is None:
        return None if callable(getattr(cell, "linear_terms", None)) else f"{type(cell).__name__} has no linear_terms"
    if linear_terms_of(cell) is None:
        return f"{type(cell)._mf_base.__name__} registers no linear terms (mf_parallel.register_linear_terms)"
    if plan.output_transform is not None:
        return "its output is transformed after the projection (e.g. gathered over the tensor-parallel group)"
    if plan.names != plan.forward.param_names[:1]:
        return f"it has parameters besides its weight ({', '.join(plan.names)}): a bias is no linear term"
    return None


def param_forward_of(cell: nn.Cell) -> ParamForward:
    for klass in type(cell).__mro__:
        if klass in _FORWARDS:
            return _FORWARDS[klass]
    raise ParallelConfigError(
        f"{type(cell).__qualname__} owns parameters {sorted(cell._params)} but has no parameter forward; "
        f"register one with mf_parallel.register_param_forward({type(cell).__name__}, names, fn)")


# ----------------------------------------------------------------------------- built-in leaves
def linear_forward(cell, weight, bias, x):
    """mint.nn.Linear: y = x W^T + b with W [out, in]."""
    return mint.nn.functional.linear(x, weight, bias)


def dense_forward(cell, weight, bias, x):
    """mindspore.nn.Dense: like Linear, plus its optional activation."""
    y = mint.matmul(x, weight.T)
    if bias is not None:
        y = y + bias
    if cell.activation_flag:
        y = cell.activation(y)
    return y


def embedding_forward(cell, table, ids):
    """mindspore.nn.Embedding: row lookup (ops.gather has a CPU kernel; mint's embedding does not)."""
    return ops.Gather()(table, ids, 0)


def linear_forward_terms(cell, weight, bias, x):
    """mint.nn.Linear without bias as one linear term (for `LinearCrossEntropy`)."""
    return ((x, weight),)


register_param_forward(mint.nn.Linear, ("weight", "bias"), linear_forward)
register_param_forward(nn.Dense, ("weight", "bias"), dense_forward)
register_param_forward(nn.Embedding, ("embedding_table",), embedding_forward)
register_linear_terms(mint.nn.Linear, linear_forward_terms)


# ----------------------------------------------------------------------------- the plan
@dataclass
class TPShard:
    """How a parameter is split over the tensor-parallel group (for metadata and clipping)."""

    axis: int
    size: int        # tp degree
    index: int       # this rank's tp coordinate
    full_shape: tuple[int, ...]


@dataclass
class LeafPlan:
    forward: ParamForward
    names: tuple[str, ...]                          # present parameters, registered order
    fn: Callable[..., Any]                          # possibly replaced by a strategy (e.g. vocab-parallel)
    input_transform: nn.Cell | None = None
    output_transform: nn.Cell | None = None
    deferred: tuple[str, ...] = ()                  # added to the output after output_transform (row-parallel bias)
    grad_sync: dict[str, nn.Cell] = field(default_factory=dict)    # name -> Cell factory result (CopyToGroup)
    deferred_sync: dict[str, Any] = field(default_factory=dict)    # name -> group whose all-reduce the step does
    tp_shards: dict[str, TPShard] = field(default_factory=dict)
    ep_shards: dict[str, TPShard] = field(default_factory=dict)   # dim 0 split over the ep group (experts)
    fsdp: Any = None                                # fsdp.FSDPParams
    regather_input: bool = False                    # input_transform (an all-gather) redone in backward


def plan_of(cell: nn.Cell) -> LeafPlan | None:
    return cell.__dict__.get("_mf_plan")


def ensure_plan(cell: nn.Cell) -> LeafPlan:
    """The leaf's plan, creating it (and switching the leaf to the planned construct) on first use."""
    plan = plan_of(cell)
    if plan is not None:
        return plan
    if not cell._params:
        raise ParallelConfigError(f"{type(cell).__qualname__} owns no parameters: it is not a leaf to transform")
    forward = param_forward_of(cell)
    unknown = set(cell._params) - set(forward.param_names)
    if unknown:
        raise ParallelConfigError(
            f"{type(cell).__qualname__} owns parameters {sorted(unknown)} its registered parameter forward "
            f"does not take ({list(forward.param_names)})")
    names = tuple(n for n in forward.param_names if getattr(cell, n, None) is not None)
    plan = LeafPlan(forward=forward, names=names, fn=forward.fn)
    object.__setattr__(cell, "_mf_plan", plan)
    base = type(cell)
    cell.__class__ = type(f"Planned{base.__name__}", (base,), {"construct": _planned_construct,
                                                               "linear_terms": _planned_linear_terms,
                                                               "_mf_base": base})
    cell.mf_param_names = names
    return plan


def _planned_construct(self, *inputs):
    params = ()
    for name in self.mf_param_names:
        params = params + (getattr(self, name),)
    return self.mf_core(*params, *inputs)


def _planned_linear_terms(self, x):
    """`linear_terms` of a planned leaf: its input transform and parameter pipelines, then the
    registered terms of what they produce (see `register_linear_terms`)."""
    params = ()
    for name in self.mf_param_names:
        params = params + (getattr(self, name),)
    return self.mf_core.linear_terms(*params, x)


def install(cell: nn.Cell) -> None:
    """(Re)build the leaf's `mf_core` from its plan: call after every change to the plan."""
    cell.mf_core = LeafCore(cell, plan_of(cell))


class _Identity(nn.Cell):
    def construct(self, x):
        return x

    def regather(self, x):
        return x

    def backward(self, x, dout):
        return dout


class _ParamPipeline(nn.Cell):
    """Stored parameter -> tensor the forward uses: FSDP gather first, then the TP gradient sync."""

    def __init__(self, gather: nn.Cell | None, sync: nn.Cell | None) -> None:
        super().__init__()
        self.gather = gather if gather is not None else _Identity()
        self.sync = sync if sync is not None else _Identity()

    def construct(self, p):
        return self.sync(self.gather(p))

    def regather(self, p):
        """The backward's gather of a resharded leaf (FSDP's `ShardGather.regather`), then the sync."""
        return self.sync(self.gather.regather(p))

    def backward(self, p, dout):
        """The adjoint of construct, without running the forward collectives again."""
        return self.gather.backward(p, self.sync.backward(p, dout))


def _input_count(leaf: nn.Cell) -> int:
    """Positional inputs of the leaf's original construct (without self)."""
    import inspect

    sig = inspect.signature(leaf._mf_base.construct)
    params = list(sig.parameters.values())[1:]
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return -1
    return len(params)


class LeafCore(nn.Cell):
    """The planned forward of one leaf (see the module docstring for the order of the stages)."""

    def __init__(self, leaf: nn.Cell, plan: LeafPlan) -> None:
        super().__init__()
        # A plain reference (not a sub-Cell: that would make the leaf its own descendant).
        object.__setattr__(self, "_leaf", leaf)
        self.fn = plan.fn
        self.terms_fn = linear_terms_of(leaf)
        self.n = len(plan.names)
        self.slots = tuple(plan.forward.param_names.index(name) for name in plan.names)
        self.nslots = len(plan.forward.param_names)
        self.deferred = tuple(plan.names.index(name) for name in plan.deferred)
        self.has_pre = plan.input_transform is not None
        self.has_post = plan.output_transform is not None
        self.pre = plan.input_transform if self.has_pre else _Identity()
        self.post = plan.output_transform if self.has_post else _Identity()
        fsdp = plan.fsdp
        pipelines = []
        for name in plan.names:
            gather = fsdp.make_gather(leaf, name) if fsdp is not None else None
            pipelines.append(_ParamPipeline(gather, plan.grad_sync.get(name)))
        self.pipes = nn.CellList(pipelines)
        # Pipelines whose forward hands back the stored Parameter itself (a one-rank shard group,
        # a 0-d parameter): the recomputing backward must differentiate a copy. In PyNative, a
        # nested GradOperation taking the Parameter object resets the gradient already accumulated
        # for it, so a Parameter shared by two leaves (tied embeddings) lost one leaf's gradient.
        self.reshard = fsdp is not None and fsdp.reshard_after_forward
        # The input's all-gather inside the recomputing body (only a gather has a recomputable adjoint here).
        self.regather = plan.regather_input and self.has_pre
        # Without FSDP resharding, a re-gathering body takes the parameters as they are: the stored
        # Parameter itself unless a pipeline stage makes a new tensor, so it is copied too.
        self.passes_param = tuple((fsdp is not None and fsdp.passes_param(name)) or (self.regather and not self.reshard)
                                  for name in plan.names)
        self.recompute = self.reshard or self.regather
        # The recomputing body sees deferred parameters as identity pipelines (their real gather
        # happens outside it): straight-line code, which a GRAPH_MODE bprop needs. Without FSDP
        # resharding, the parameters enter the body ready (pipelines run outside it, once).
        self.body_pipes = nn.CellList([_Identity() if i in self.deferred or not self.reshard else pipelines[i]
                                       for i in range(self.n)])
        if self.recompute:
            arity = self.n + _input_count(leaf)
            if arity not in RECOMPUTE_BY_ARITY:
                what = "reshard_after_forward" if self.reshard else "recompute_comm's re-gathered input"
                raise ParallelConfigError(
                    f"{type(leaf).__qualname__} takes {arity} parameters + inputs; {what} supports 2 to 4"
                    + ("; use reshard_after_forward=False for this unit" if self.reshard else ""))
            self.body = RECOMPUTE_BY_ARITY[arity](self)

    def place(self, params):
        """Parameters in registered-slot order, None for absent or deferred ones."""
        full = ()
        for slot in range(self.nslots):
            value = None
            for i in range(self.n):
                if self.slots[i] == slot and i not in self.deferred:
                    value = params[i]
            full = full + (value,)
        return full

    def ready(self, params):
        """Each parameter through its pipeline, except the deferred ones (their pipeline runs where
        they are added, after the output transform; `place` leaves them out here anyway)."""
        out = ()
        for i in range(self.n):
            out = out + ((params[i] if i in self.deferred else self.pipes[i](params[i])),)
        return out

    def apply_fn(self, params, inputs):
        return self.fn(self._leaf, *self.place(params), *inputs)

    def linear_terms(self, *args):
        """The registered linear terms of the leaf's ready parameters and transformed input, for a
        fused projection + loss (`linear_terms_problem` says when they stand in for the output).
        The parameters go through their pipelines outside any recomputing body: the fused loss
        keeps neither them nor the input for its backward, so nothing is re-gathered there."""
        params = args[: self.n]
        x = args[self.n]
        if self.has_pre:
            x = self.pre(x)
        return self.terms_fn(self._leaf, *self.place(self.ready(params)), x)

    def construct(self, *args):
        params = args[: self.n]
        inputs = args[self.n:]
        if self.has_pre and not self.regather:
            inputs = (self.pre(inputs[0]),) + inputs[1:]
        if self.reshard:
            out = self.body(*params, *inputs)
        elif self.recompute:
            out = self.body(*self.ready(params), *inputs)
        else:
            out = self.apply_fn(self.ready(params), inputs)
        if self.has_post:
            out = self.post(out)
        for i in self.deferred:
            out = out + self.pipes[i](params[i])
        return out


class _RecomputeBase(nn.Cell):
    """Gather + parameter forward whose backward gathers again (FSDP reshard-after-forward).

    Forward keeps nothing but the shards and inputs; backward re-runs the parameter pipelines,
    differentiates the parameter forward with respect to the full parameters and inputs, and sends
    the parameter gradients through each pipeline's `backward` (reduce-scatter etc.) without
    running its forward collective a third time. GRAPH_MODE wants a bprop with explicit
    parameters, hence one subclass per arity (shards + inputs).
    """

    def __init__(self, core: LeafCore) -> None:
        super().__init__()
        object.__setattr__(self, "_core", core)
        self.grad_all = ops.GradOperation(get_all=True, sens_param=True)
        self.copy = ops.Identity()

    def _full(self, params):
        ready = ()
        for i in range(len(params)):
            ready = ready + (self._core.body_pipes[i](params[i]),)
        return ready

    def _refull(self, params):
        """`_full` in the backward: the same gathers through their backward Cells."""
        ready = ()
        for i in range(len(params)):
            ready = ready + (self._core.body_pipes[i].regather(params[i]),)
        return ready

    def run(self, *flat):
        n = self._core.n
        return self._core.apply_fn(flat[:n], flat[n:])

    def _inputs(self, inputs):
        """The parameter forward's inputs: the first one all-gathered when the core re-gathers it."""
        if self._core.regather:
            return (self._core.pre(inputs[0]),) + inputs[1:]
        return inputs

    def recompute_forward(self, flat):
        n = self._core.n
        return self.run(*self._full(flat[:n]), *self._inputs(flat[n:]))

    def full_flat(self, flat, dout):
        """Shards gathered again (the reshard-after-forward cost), and the first input too when the
        core re-gathers it (recompute_comm); other inputs unchanged. What is gathered is made to
        depend on the incoming gradient: the gather then belongs to the backward, and a compiler
        cannot merge it with the forward's identical gather (seen for an embedding table in
        GRAPH_MODE), which would silently keep the full tensor alive."""
        n = self._core.n
        shards = ()
        for i in range(n):
            shards = shards + (ops.depend(flat[i], dout),)
        full = self._refull(shards)
        fresh = ()
        for i in range(n):
            fresh = fresh + ((self.copy(full[i]) if self._core.passes_param[i] else full[i]),)
        inputs = flat[n:]
        if self._core.regather:
            inputs = (ops.depend(inputs[0], dout),) + inputs[1:]
        return fresh + self._inputs(inputs)

    def finish(self, flat, grads):
        """Parameter gradients through each pipeline's adjoint; input gradients as they are, but
        the re-gathered input's through the gather's adjoint (reduce-scatter)."""
        n = self._core.n
        dparams = ()
        for i in range(n):
            dparams = dparams + (self._core.body_pipes[i].backward(flat[i], grads[i]),)
        dinputs = grads[n:]
        if self._core.regather:
            dinputs = (self._core.pre.backward(flat[n], dinputs[0]),) + dinputs[1:]
        return dparams + dinputs


# GradOperation in a GRAPH_MODE bprop needs its arguments spelled out (star-unpacking a tuple
# into the differentiated call fails to compile on 2.10.0), hence the repetition below.
class _Recompute2(_RecomputeBase):
    def fixed_run(self, a, b):
        return self.run(a, b)

    def construct(self, a, b):
        return self.recompute_forward((a, b))

    def bprop(self, a, b, out, dout):
        f = self.full_flat((a, b), dout)
        return self.finish((a, b), self.grad_all(self.fixed_run)(f[0], f[1], dout))


class _Recompute3(_RecomputeBase):
    def fixed_run(self, a, b, c):
        return self.run(a, b, c)

    def construct(self, a, b, c):
        return self.recompute_forward((a, b, c))

    def bprop(self, a, b, c, out, dout):
        f = self.full_flat((a, b, c), dout)
        return self.finish((a, b, c), self.grad_all(self.fixed_run)(f[0], f[1], f[2], dout))


class _Recompute4(_RecomputeBase):
    def fixed_run(self, a, b, c, d):
        return self.run(a, b, c, d)

    def construct(self, a, b, c, d):
        return self.recompute_forward((a, b, c, d))

    def bprop(self, a, b, c, d, out, dout):
        f = self.full_flat((a, b, c, d), dout)
        return self.finish((a, b, c, d), self.grad_all(self.fixed_run)(f[0], f[1], f[2], f[3], dout))


RECOMPUTE_BY_ARITY = {2: _Recompute2, 3: _Recompute3, 4: _Recompute4}
