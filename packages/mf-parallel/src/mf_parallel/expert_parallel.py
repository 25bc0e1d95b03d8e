"""Expert parallelism: the experts split over the "ep" group, tokens exchanged by all-to-all.

Layout (Megatron's): the ep ranks are carved out of the flattened dp_shard x cp axis
(`ParallelDims`), so they read different tokens. Rank r of an ep group of size P holds experts
[r * E/P, (r + 1) * E/P) of every MoE layer (`shard_experts`: dim 0 of the stacked expert weights);
the remaining data-parallel ranks holding the same experts ("dp_shard_mod_ep", the experts' own
mesh view) FSDP-shard them, and their gradients are reduce-scattered there and all-reduced over
dp_replicate. Non-expert weights stay as FSDP/HSDP put them.

`AllToAllTokenDispatcher` replaces a MoE layer's one-rank dispatcher with the same two calls:

    dispatch(tokens [T, H], topk_idx [T, k])
        PyNative (training on CPU, where every step runs eagerly): counts first, then variable
        sizes (`ExpertRoute`, expert_exchange.py). Each assignment a = (token a // k, expert e_a)
        goes to the rank owning e_a: the per-(destination, local expert) counts by one all-to-all,
        then only the routed rows, sorted by destination and expert, by a variable all-to-all
        (rows for this rank's own experts stay local). The receiver knows each row's expert from
        the counts and lays the rows out for its experts with the model's one-rank dispatcher
        (`local`).
        GRAPH_MODE (shapes must be known when the step compiles): a static send buffer [P, N, H]
        (N = T k) whose slot [r, a] holds the token row if rank r owns e_a, else zeros; one
        all-to-all, so rank r receives [P, N, H]; the expert ids travel by an all-gather over ep
        and every zero slot goes to one extra "null" expert of `local`, whose blocks run on zero
        rows. That is the worst case on every step (P x the rows of the variable exchange when
        routing is even, and the null expert's blocks); the dispatcher logs once that it uses it.
    combine(expert_rows, handle, topk_weights)
        each assignment's output row back by the reverse exchange (variable: sizes swapped;
        static: the reverse all-to-all, each assignment's row taken from its owner's slot),
        weighted by the router and summed over a token's k experts, in the one-rank dispatcher's
        order.

Counted bytes (`comm_stats`) of the variable path, per MoE layer call: `all_to_all` the counts
((P - 1) x E/P int32 to the other ranks), `all_to_all_v` the rows sent to other ranks x H x
itemsize, four times per training step (tokens out and back, and both gradients).
The routing statistics (`load`, the balance-loss counts and sums) are computed by the router on
this rank's own tokens before anything moves, so summed over the data-parallel ranks they are
exactly those of one process.

Backward: the all-to-all of [P, ...] buffers along dim 0 is its own adjoint (`ExpertExchange`),
as is the variable one with the sizes swapped (`VariableExchange`), so gradients return along the
same routes; an expert's weight gradient gathers every rank's
tokens routed to it, and needs no reduction over ep.
"""

from __future__ import annotations

import logging

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from mf_parallel.collectives import AllGather, AllToAll
from mf_parallel.errors import ParallelConfigError
from mf_parallel.expert_exchange import ExpertRoute
from mf_parallel.fsdp import fully_shard
from mf_parallel.leaf import ensure_plan, plan_of
from mf_parallel.mesh import DeviceMesh, Group
from mf_parallel.tensor_parallel import reslice

log = logging.getLogger("mf_parallel")
_STATIC_LOGGED: set[str] = set()


def variable_exchange(kind: str) -> bool:
    """Whether a dispatcher built now exchanges variable sizes (PyNative: sizes read on the host)
    or static worst-case buffers (GRAPH_MODE: every shape fixed at compile time; said once)."""
    if ms.get_context("mode") == ms.PYNATIVE_MODE:
        return True
    if kind not in _STATIC_LOGGED:
        _STATIC_LOGGED.add(kind)
        log.info("%s under GRAPH_MODE: static worst-case token buffers (every shape must be known when the step "
                 "compiles); the counts-first variable-size exchange runs in PyNative mode (context.mode 1)", kind)
    return False


class TwoPathDispatcher(nn.Cell):
    """The two calls of an expert-parallel dispatcher, on the path chosen when it was built
    (`variable_exchange`): counts first and variable sizes, or static worst-case buffers. A
    subclass gives `_variable_dispatch` / `_variable_combine` and `_static_dispatch` /
    `_static_combine`, and sets `self.variable`."""

    def dispatch(self, x, topk_idx):
        """As the one-rank dispatcher: (rows, block_expert, handle, tokens_per_expert [E] of this
        rank's tokens, counts [2] = (dropped 0, padding rows computed here))."""
        if self.variable:
            return self._variable_dispatch(x, topk_idx)
        return self._static_dispatch(x, topk_idx)

    def combine(self, expert_rows, handle, topk_weights):
        """expert_rows [nb*b, H] of the local experts -> this rank's tokens [T, H]."""
        if self.variable:
            return self._variable_combine(expert_rows, handle, topk_weights)
        return self._static_combine(expert_rows, handle, topk_weights)


class ExpertExchange(nn.Cell):
    """All-to-all of a [P, ...] buffer along dim 0 over `group` (slot j goes to rank j, slot s of
    the result came from rank s). It is its own adjoint: the backward exchanges the gradient."""

    def __init__(self, group: Group) -> None:
        super().__init__()
        self.forward_a2a = AllToAll(group, 0, 0)
        self.backward_a2a = AllToAll(group, 0, 0)

    def construct(self, x):
        return self.forward_a2a(x)

    def backward(self, x, dout):
        return self.backward_a2a(dout)

    def bprop(self, x, out, dout):
        return (self.backward_a2a(dout),)


class AllToAllTokenDispatcher(TwoPathDispatcher):
    """`dispatch` / `combine` of a MoE layer whose `num_experts` experts are split over `group`
    (see the module docstring). `local` is a one-rank dispatcher for `num_experts / P + 1` experts
    and top-1 (the last one is the null expert of empty slots); no parameters."""

    def __init__(self, group: Group, num_experts: int, top_k: int, local: nn.Cell) -> None:
        super().__init__()
        if num_experts % group.size:
            raise ParallelConfigError(f"parallelism.expert_parallel: {group.size} does not divide the {num_experts} "
                                      f"routed experts; use a divisor of {num_experts}")
        self.ep = group.size
        self.num_experts = num_experts
        self.local_experts = num_experts // group.size
        self.top_k = top_k
        self.local = local
        self.exchange = ExpertExchange(group)
        self.reverse = ExpertExchange(group)
        self.expert_ids = AllGather(group, 0)
        self.first = ms.Tensor(group.rank * self.local_experts, ms.int32)
        self.ranks = ops.arange(0, group.size, dtype=ms.int32).reshape(group.size, 1)
        self.one = ms.Tensor(1, ms.int32)
        self.zero = ms.Tensor(0, ms.int32)
        self.variable = variable_exchange("alltoall")
        self.route = ExpertRoute(group, self.local_experts, local)

    def _variable_dispatch(self, x, topk_idx):
        tokens, k = topk_idx.shape
        flat = topk_idx.reshape(tokens * k)
        load = ops.one_hot(flat, self.num_experts, self.one, self.zero).sum(0).astype(ms.float32)
        expert = flat.asnumpy().astype(np.int64)          # the host sync the variable sizes need
        row = np.arange(expert.size) // k
        rows, block_expert, handle, received = self.route.dispatch(
            x, row, expert // self.local_experts, expert % self.local_experts)
        counts = ops.stack((ops.zeros((), ms.float32), ms.Tensor(rows.shape[0] - received, ms.float32)))
        return rows, block_expert, handle, ops.stop_gradient(load), ops.stop_gradient(counts)

    def _variable_combine(self, expert_rows, handle, topk_weights):
        tokens, k = topk_weights.shape
        picked = self.route.combine(expert_rows, handle)                                 # [N, H]
        weighted = picked * topk_weights.reshape(tokens * k, 1)
        return weighted.reshape(tokens, k, -1).sum(1).astype(expert_rows.dtype)

    def _static_dispatch(self, x, topk_idx):
        tokens, hidden = x.shape
        k, p = self.top_k, self.ep
        n = tokens * k
        flat = topk_idx.reshape(n)
        load = ops.one_hot(flat, self.num_experts, self.one, self.zero).sum(0).astype(ms.float32)
        owner = flat // self.local_experts
        mask = (owner.reshape(1, n) == self.ranks).astype(x.dtype)                       # [P, N]
        assigned = ops.gather(x, ops.arange(0, n, dtype=ms.int32) // k, 0)               # [N, H]
        send = assigned.reshape(1, n, hidden) * mask.reshape(p, n, 1)                    # [P, N, H]
        received = self.exchange(send).reshape(p * n, hidden)
        ids = self.expert_ids(ops.stop_gradient(flat.astype(ms.float32)).reshape(1, n))  # [P, N]: every source's
        local_id = ids.astype(ms.int32).reshape(p * n) - self.first
        mine = ops.logical_and(local_id >= 0, local_id < self.local_experts)
        local_id = ops.where(mine, local_id, ops.full_like(local_id, self.local_experts))   # the null expert
        rows, block_expert, dest, _, _ = self.local.dispatch(received, local_id.reshape(p * n, 1))
        block_expert = ops.minimum(block_expert, self.local_experts - 1)     # null blocks: zero rows, any expert
        real = mine.astype(ms.float32).sum()
        counts = ops.stack((ops.zeros((), ms.float32), rows.shape[0] - real))   # dropless: nothing dropped
        return (rows, block_expert, (dest, ops.stop_gradient(mask)), ops.stop_gradient(load),
                ops.stop_gradient(counts))

    def _static_combine(self, expert_rows, handle, topk_weights):
        dest, mask = handle
        tokens, k = topk_weights.shape
        p, n = self.ep, tokens * k
        out = ops.gather(expert_rows, dest, 0).astype(ms.float32)                        # [P*N, H] received slots
        back = self.reverse(out.reshape(p, n, -1))                                       # [P, N, H]: owner r's rows
        picked = (back * mask.astype(ms.float32).reshape(p, n, 1)).sum(0)                # zeros but the owner's
        weighted = picked * topk_weights.reshape(n, 1)
        return weighted.reshape(tokens, k, -1).sum(1).astype(expert_rows.dtype)


def shard_experts(experts: nn.Cell, mesh: DeviceMesh, param_names=("w1", "w2", "w3"), *,
                  disable_gradient_division: bool = True) -> None:
    """Keep this ep rank's block of dim 0 (the expert axis) of each stacked expert weight of the
    leaf `experts`, then FSDP-shard it over the ranks holding the same experts ("dp_shard_mod_ep";
    the identity when ep covers dp_shard x cp) without reshard-after-forward. Parameter names and
    the checkpoint layout stay global (`param_layouts`). Before `fully_shard` of the enclosing
    units (which then leave these parameters alone) and before the first call."""
    group = mesh["ep"]
    plan = plan_of(experts)
    if plan is not None and (plan.fsdp is not None or plan.tp_shards):
        raise ParallelConfigError("shard_experts: apply expert parallelism before tensor parallelism touches the "
                                  "experts and before fully_shard")
    if group.size > 1:
        for name in param_names:
            if getattr(experts, name, None) is None:
                raise ParallelConfigError(f"shard_experts: {type(experts).__name__} has no parameter {name!r}")
            reslice(experts, name, 0, group, "parallelism.expert_parallel")
        plan = ensure_plan(experts)
        plan.ep_shards.update({name: plan.tp_shards.pop(name) for name in param_names})
    fully_shard(experts, mesh, reshard_after_forward=False, disable_gradient_division=disable_gradient_division,
                group="dp_shard_mod_ep")
