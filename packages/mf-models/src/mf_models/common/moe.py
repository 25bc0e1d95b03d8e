"""Mixture of experts as DeepSeek-V3 defines it: sigmoid router with a score-correction bias,
group-limited top-k, normalised and scaled weights, stacked routed experts, shared experts.

Computation choice (one process, graph mode): *dense-masked*. Every routed expert runs on every
token as one batched matmul over the stacked [E, out, in] weights, and the outputs are combined
with a dense [T, E] weight matrix that is zero outside each token's top-k. All shapes are static,
there is no data-dependent control flow, and the result equals HF's per-expert loop exactly
(a zero weight contributes nothing to values or gradients). The price is E / top_k times the
routed-expert FLOPs and an [E, T, I] activation: right for small expert counts and tests, wrong
for a 256-expert model. Sort-based dispatch with a capacity would cut the FLOPs but drops tokens
over capacity (changing the math) and needs all-to-all for expert parallelism; that belongs to
the EP plan, which can replace `moe.experts` with a dispatching version that takes the same
(x, routing weights) inputs.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import Parameter, Tensor, mint, nn, ops

from .layers import FeedForward, Linear, _zeros


def router_forward(cell, expert_bias, x):
    """`TopKRouter`: routing weights [T, E] from hidden states [T, H] (the bias passed in)."""
    scores = ops.sigmoid(cell.gate(x.astype(ms.float32)))
    # Selection is not differentiated (HF: no_grad); gradients reach the gate through `scores`.
    choice = ops.stop_gradient(scores) + expert_bias
    if cell.n_group > 1:
        tokens = choice.shape[0]
        grouped = choice.reshape(tokens, cell.n_group, cell.num_experts // cell.n_group)
        group_scores = ops.topk(grouped, 2)[0].sum(-1)
        _, group_idx = ops.topk(group_scores, cell.topk_group)
        group_mask = ops.one_hot(group_idx, cell.n_group, cell.one, cell.zero).sum(1)
        expert_mask = ops.broadcast_to(ops.expand_dims(group_mask, -1), grouped.shape).reshape(tokens, -1)
        # HF fills excluded experts with 0.0 (not -inf); a negative biased score can lose to them.
        choice = choice * expert_mask
    _, topk_idx = ops.topk(choice, cell.top_k)
    weights = ops.gather_elements(scores, 1, topk_idx)
    if cell.norm_topk_prob:
        weights = weights / (weights.sum(-1, keepdims=True) + 1e-20)
    weights = weights * cell.routed_scaling_factor
    one_hot = ops.one_hot(topk_idx, cell.num_experts, cell.one, cell.zero)  # [T, k, E]
    return (one_hot * ops.expand_dims(weights, -1)).sum(1)


def experts_forward(cell, w1, w2, w3, x, routing_weights):
    """`GroupedExperts`: x [T, H], routing_weights [T, E] -> [T, H] (the stacked weights passed in)."""
    cdt = cell.compute_dtype
    num_experts = w1.shape[0]
    xe = ops.broadcast_to(ops.expand_dims(x.astype(cdt), 0), (num_experts,) + x.shape)  # [E, T, H]
    gate = cell.bmm_nt(xe, w1.astype(cdt))
    up = cell.bmm_nt(xe, w3.astype(cdt))
    out = cell.bmm_nt(mint.nn.functional.silu(gate) * up, w2.astype(cdt))  # [E, T, H]
    weights = ops.expand_dims(ops.transpose(routing_weights, (1, 0)), -1)  # [E, T, 1] float32
    return (out.astype(ms.float32) * weights).sum(0).astype(cdt)


class TopKRouter(nn.Cell):
    """Routing weights [T, E] (zero outside each token's top-k) from hidden states [T, H]."""

    def __init__(self, dim: int, num_experts: int, top_k: int, n_group: int, topk_group: int,
                 norm_topk_prob: bool, routed_scaling_factor: float, params_dtype: ms.Type = ms.float32):
        super().__init__()
        # The router runs in float32 whatever the compute dtype, as in HF.
        self.gate = Linear(dim, num_experts, False, params_dtype, ms.float32)
        # Aux-loss-free balancing bias: moves expert *selection* only, updated outside autograd.
        self.expert_bias = Parameter(_zeros((num_experts,), ms.float32), name="expert_bias", requires_grad=False)
        self.num_experts = num_experts
        self.top_k = top_k
        self.n_group = n_group
        self.topk_group = topk_group
        self.norm_topk_prob = norm_topk_prob
        self.routed_scaling_factor = routed_scaling_factor
        self.one = Tensor(1.0, ms.float32)
        self.zero = Tensor(0.0, ms.float32)

    def construct(self, x):
        return router_forward(self, self.expert_bias, x)


class GroupedExperts(nn.Cell):
    """E SwiGLU experts stacked as w1/w3 [E, I, H] and w2 [E, H, I] (torch [out, in] per expert)."""

    def __init__(self, dim: int, hidden_dim: int, num_experts: int, top_k: int,
                 params_dtype: ms.Type = ms.float32, compute_dtype: ms.Type = ms.float32):
        super().__init__()
        self.w1 = Parameter(_zeros((num_experts, hidden_dim, dim), params_dtype), name="w1")
        self.w2 = Parameter(_zeros((num_experts, dim, hidden_dim), params_dtype), name="w2")
        self.w3 = Parameter(_zeros((num_experts, hidden_dim, dim), params_dtype), name="w3")
        self.compute_dtype = compute_dtype
        self.top_k = top_k
        self.expert_params = 3 * hidden_dim * dim     # per expert; not read from the (maybe sharded) weights
        self.bmm_nt = ops.BatchMatMul(transpose_b=True)

    def active_params_per_token(self) -> int:
        return self.expert_params * self.top_k

    def construct(self, x, routing_weights):
        """x [T, H], routing_weights [T, E] -> [T, H]."""
        return experts_forward(self, self.w1, self.w2, self.w3, x, routing_weights)


class MoE(nn.Cell):
    """routed experts (weighted by the router) + shared experts, on [B, S, H]."""

    def __init__(self, dim: int, moe_hidden_dim: int, num_experts: int, top_k: int, n_shared_experts: int,
                 n_group: int, topk_group: int, norm_topk_prob: bool, routed_scaling_factor: float,
                 params_dtype: ms.Type = ms.float32, compute_dtype: ms.Type = ms.float32):
        super().__init__()
        self.router = TopKRouter(dim, num_experts, top_k, n_group, topk_group, norm_topk_prob,
                                 routed_scaling_factor, params_dtype)
        self.experts = GroupedExperts(dim, moe_hidden_dim, num_experts, top_k, params_dtype, compute_dtype)
        self.has_shared = n_shared_experts > 0
        if self.has_shared:
            self.shared_experts = FeedForward(dim, moe_hidden_dim * n_shared_experts, False, params_dtype,
                                              compute_dtype)

    def construct(self, x):
        b, s, h = x.shape
        tokens = x.reshape(b * s, h)
        out = self.experts(tokens, self.router(tokens)).reshape(b, s, h)
        if self.has_shared:
            out = out + self.shared_experts(x)
        return out
