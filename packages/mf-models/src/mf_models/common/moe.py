"""The one MoE layer of every MoE model: router -> dropless dispatch -> stacked experts -> combine,
plus shared experts (DeepSeek, GLM-4.5; Qwen2-MoE's scaled by a sigmoid gate) or none (Mixtral,
Qwen3-MoE).

    idx, w, aux_scores, aux_idx = router(x)              common/router.py (the router kind is data)
    rows, block_expert, dest, load, counts = dispatcher.dispatch(x, idx)     common/dispatch.py
    y = dispatcher.combine(experts(rows, block_expert), dest, w)  (+ shared_experts(x)
                                                                     [* sigmoid(shared_expert_gate(x))])

Routed experts are SwiGLU MLPs stacked as w1/w3 [E, I, H] and w2 [E, H, I] (torch's [out, in]
per expert): w1 = gate_proj (Mixtral's w1), w3 = up_proj (w3), w2 = down_proj (w2).

`MoE.construct` returns the output and the routing statistics of this call, so a training
forward gets them without a second pass (`CausalLM.forward_train`):
    load [E]          assignments per expert (the aux-loss-free bias update and the monitor)
    counts [2]        (dropped assignments, padding rows computed): dropped is 0 by construction
    aux_counts [B, E] per sequence, assignments counted for the balance loss
    aux_sums [B, E]   per sequence, the sum of the balance loss's scores (differentiable)
The last two are zeros (and nothing is computed) when the model has no balance loss.
`experts_dense_reference` is the old dense-masked formula (every expert on every token), kept as
the reference the dispatch is tested against.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import Parameter, mint, nn, ops

from .dispatch import LocalDispatcher
from .layers import FeedForward, Linear, zeros_tensor
from .router import RouterSpec, TopKRouter

_bmm_nt = ops.BatchMatMul(transpose_b=True)


def experts_forward(cell, w1, w2, w3, rows, block_expert):
    """`GroupedExperts`: rows [nb*b, H] in expert blocks, block_expert [nb] -> [nb*b, H].

    One batched matmul over the blocks, each with its expert's weights (gathered: the gradient is
    a segment sum back into the stacked [E, ...] parameters)."""
    cdt = cell.compute_dtype
    blocks = block_expert.shape[0]
    x = rows.astype(cdt).reshape(blocks, -1, rows.shape[-1])                       # [nb, b, H]
    gate = _bmm_nt(x, ops.gather(w1, block_expert, 0).astype(cdt))                 # [nb, b, I]
    up = _bmm_nt(x, ops.gather(w3, block_expert, 0).astype(cdt))
    out = _bmm_nt(mint.nn.functional.silu(gate) * up, ops.gather(w2, block_expert, 0).astype(cdt))
    return out.reshape(rows.shape[0], -1)


def experts_dense_reference(w1, w2, w3, x, topk_idx, topk_weights):
    """Every expert on every token, combined with a dense [T, E] weight matrix that is zero outside
    each token's top-k (E / k times the routed FLOPs; float32). Reference only."""
    num_experts = w1.shape[0]
    one_hot = ops.one_hot(topk_idx, num_experts, ms.Tensor(1.0, ms.float32), ms.Tensor(0.0, ms.float32))
    dense = (one_hot * ops.expand_dims(topk_weights, -1)).sum(1)                     # [T, E]
    xe = ops.broadcast_to(ops.expand_dims(x, 0), (num_experts,) + x.shape)           # [E, T, H]
    out = _bmm_nt(mint.nn.functional.silu(_bmm_nt(xe, w1)) * _bmm_nt(xe, w3), w2)  # [E, T, H]
    return (out * ops.expand_dims(ops.transpose(dense, (1, 0)), -1)).sum(0)


class GroupedExperts(nn.Cell):
    """E SwiGLU experts stacked as w1/w3 [E, I, H] and w2 [E, H, I]; computes on dispatched rows."""

    def __init__(self, dim: int, hidden_dim: int, num_experts: int, top_k: int,
                 params_dtype: ms.Type = ms.float32, compute_dtype: ms.Type = ms.float32):
        super().__init__()
        self.w1 = Parameter(zeros_tensor((num_experts, hidden_dim, dim), params_dtype), name="w1")
        self.w2 = Parameter(zeros_tensor((num_experts, dim, hidden_dim), params_dtype), name="w2")
        self.w3 = Parameter(zeros_tensor((num_experts, hidden_dim, dim), params_dtype), name="w3")
        self.compute_dtype = compute_dtype
        self.num_experts = num_experts
        self.top_k = top_k
        self.expert_params = 3 * hidden_dim * dim     # per expert; not read from the (maybe sharded) weights

    def active_params_per_token(self) -> int:
        return self.expert_params * self.top_k

    def construct(self, rows, block_expert):
        return experts_forward(self, self.w1, self.w2, self.w3, rows, block_expert)


class MoE(nn.Cell):
    """Routed experts (weighted by the router) + optional shared experts, on [B, S, H].

    `shared_hidden` is the shared experts' total intermediate size (0: none); `shared_gate` scales
    their output by sigmoid(shared_expert_gate(x)) per token (Qwen2-MoE; `shared_expert_gate`
    [1, H]). `balance_loss` says whether the per-sequence balance statistics are needed (else
    they are zeros).
    """

    def __init__(self, dim: int, moe_hidden_dim: int, spec: RouterSpec, shared_hidden: int = 0,
                 balance_loss: bool = False, params_dtype: ms.Type = ms.float32,
                 compute_dtype: ms.Type = ms.float32, shared_gate: bool = False):
        super().__init__()
        self.router = TopKRouter(dim, spec, params_dtype)
        self.dispatcher = LocalDispatcher(spec.num_experts, spec.top_k)
        self.experts = GroupedExperts(dim, moe_hidden_dim, spec.num_experts, spec.top_k, params_dtype, compute_dtype)
        self.num_experts = spec.num_experts
        self.top_k = spec.top_k
        self.balance_loss = balance_loss
        self.has_shared = shared_hidden > 0
        self.shared_gated = self.has_shared and shared_gate
        if self.has_shared:
            self.shared_experts = FeedForward(dim, shared_hidden, False, params_dtype, compute_dtype)
        if self.shared_gated:
            self.shared_expert_gate = Linear(dim, 1, False, params_dtype, compute_dtype)
        self.one = ms.Tensor(1.0, ms.float32)
        self.zero = ms.Tensor(0.0, ms.float32)

    def construct(self, x):
        b, s, h = x.shape
        tokens = x.reshape(b * s, h)
        idx, weights, aux_scores, aux_idx = self.router(tokens)
        rows, block_expert, dest, load, counts = self.dispatcher.dispatch(tokens, idx)
        out = self.dispatcher.combine(self.experts(rows, block_expert), dest, weights).reshape(b, s, h)
        if self.shared_gated:
            out = out + ops.sigmoid(self.shared_expert_gate(x)) * self.shared_experts(x)
        elif self.has_shared:
            out = out + self.shared_experts(x)
        if self.balance_loss:
            picked = ops.one_hot(aux_idx, self.num_experts, self.one, self.zero)              # [T, k, E]
            aux_counts = ops.stop_gradient(picked.reshape(b, s * self.top_k, -1).sum(1))
            aux_sums = aux_scores.reshape(b, s, -1).sum(1)
        else:
            aux_counts = ops.zeros((b, self.num_experts), ms.float32)
            aux_sums = aux_counts
        return out, load, counts, aux_counts, aux_sums
