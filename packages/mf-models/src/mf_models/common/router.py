"""Top-k routing for every MoE model, the router's kind given as data (`RouterSpec`).

One formula, parameterised the way transformers computes each model (5.2x):

    logits  = gate(x)                                  float32 whatever the compute dtype
    scores  = softmax(logits) | sigmoid(logits)        `score_func`
    choice  = scores (+ expert_bias)                   selection only; never differentiated
    choice  = group-limited (n_group > 1): keep the `topk_group` groups whose best two choices
              sum highest, the rest set to 0.0 (DeepSeek-V3 as HF: a negative biased score can
              lose to an excluded expert) or -inf (GLM-4.5: `group_mask_value`)
    idx     = top-k(choice)
    weights = scores[idx]   (/ (sum + norm_eps) if norm_topk_prob)   * routed_scaling_factor

| model | score_func | expert_bias | groups | norm_topk_prob | norm_eps | scaling |
|---|---|---|---|---|---|---|
| deepseek_v3 (DeepseekV3TopkRouter/MoE) | sigmoid | yes | n_group/topk_group (0.0) | config | 1e-20 | config |
| glm4_moe (Glm4MoeTopkRouter) | sigmoid | yes | n_group/topk_group (-inf) | config | 1e-20 | config |
| mixtral (MixtralTopKRouter) | softmax | no | no | always | 0 | 1 |
| qwen3_moe (Qwen3MoeTopKRouter), qwen2_moe | softmax | no | no | config | 0 | 1 |

Mixtral's original reference code takes the top-k of the logits and a softmax over those k;
transformers takes the softmax over all experts, the top-k of the probabilities and renormalises
them: the same numbers in exact arithmetic, and the transformers order is the one computed here.

The router also yields what the auxiliary losses and the monitor need (see `common/balancing.py`):
the selection counts per sequence, and the per-sequence sums of the aux-loss scores. For sigmoid
routers those scores are the sigmoid scores normalised over all experts and their counts come from
a plain top-k of them (no bias, no group limit): DeepSeek-V3's sequence-wise balance loss as the
paper writes it (eq. 17-20) and Megatron-Core computes it (`compute_routing_scores_for_aux_loss`).
For softmax routers they are the probabilities and the actual selection (transformers'
`load_balancing_loss_func`).
"""

from __future__ import annotations

from dataclasses import dataclass

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from .layers import Linear, zeros_tensor

SCORE_FUNCS = ("softmax", "sigmoid")


@dataclass(frozen=True)
class RouterSpec:
    """How one model routes (see the module table)."""

    num_experts: int
    top_k: int
    score_func: str = "softmax"
    expert_bias: bool = False
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = False
    norm_eps: float = 0.0
    routed_scaling_factor: float = 1.0
    group_mask_value: float = 0.0      # what the experts of unchosen groups score (0.0 or -inf)

    def __post_init__(self) -> None:
        if self.score_func not in SCORE_FUNCS:
            raise ValueError(f"RouterSpec.score_func: {self.score_func!r} is not one of {SCORE_FUNCS}")
        if not 0 < self.top_k <= self.num_experts:
            raise ValueError(f"RouterSpec.top_k: {self.top_k} is not in [1, {self.num_experts}]")
        if self.num_experts % self.n_group or self.topk_group > self.n_group:
            raise ValueError(f"RouterSpec: {self.n_group} groups / {self.topk_group} chosen do not fit "
                             f"{self.num_experts} experts")


def _normalise(weights, eps: float):
    total = weights.sum(-1, keepdims=True)
    return weights / (total + eps) if eps else weights / total


def router_forward(cell, expert_bias, x):
    """`TopKRouter`: x [T, H] -> (topk_idx [T, k] int32, topk_weights [T, k] float32,
    aux_scores [T, E] float32, aux_idx [T, k] int32). The bias (None when the router has none) is
    handed in by mf-parallel's parameter plumbing."""
    logits = cell.gate(x.astype(ms.float32))
    if cell.sigmoid:
        scores = ops.sigmoid(logits)
    else:
        scores = ops.softmax(logits, -1)
    # Selection is not differentiated (HF: no_grad / topk indices); gradients reach the gate
    # through the gathered `scores`.
    choice = ops.stop_gradient(scores)
    if expert_bias is not None:
        choice = choice + expert_bias
    if cell.n_group > 1:
        tokens = choice.shape[0]
        grouped = choice.reshape(tokens, cell.n_group, cell.num_experts // cell.n_group)
        group_scores = ops.topk(grouped, 2)[0].sum(-1)
        _, group_idx = ops.topk(group_scores, cell.topk_group)
        group_mask = ops.one_hot(group_idx, cell.n_group, cell.one, cell.zero).sum(1)
        expert_mask = ops.broadcast_to(ops.expand_dims(group_mask, -1), grouped.shape).reshape(tokens, -1)
        if cell.group_mask_inf:
            choice = ops.where(expert_mask > 0.5, choice, cell.neg_inf)
        else:
            choice = choice * expert_mask
    _, topk_idx = ops.topk(choice, cell.top_k)
    weights = ops.gather_elements(scores, 1, topk_idx)
    if cell.norm_topk_prob:
        weights = _normalise(weights, cell.norm_eps)
    if cell.routed_scaling_factor != 1.0:
        weights = weights * cell.routed_scaling_factor
    if cell.sigmoid:
        aux_scores = _normalise(scores, 1e-20)
        aux_idx = ops.topk(ops.stop_gradient(aux_scores), cell.top_k)[1]
    else:
        aux_scores, aux_idx = scores, topk_idx
    return topk_idx.astype(ms.int32), weights, aux_scores, aux_idx.astype(ms.int32)


class TopKRouter(nn.Cell):
    """Hidden states [T, H] -> each token's top-k experts and their weights (see `router_forward`).

    `gate` [E, H] is HF's `gate.weight`; `expert_bias` [E] (DeepSeek's `e_score_correction_bias`)
    exists only for routers that have one. It is not trainable: aux-loss-free balancing moves it
    outside autograd (`mf_models.update_expert_bias`).
    """

    def __init__(self, dim: int, spec: RouterSpec, params_dtype: ms.Type = ms.float32):
        super().__init__()
        # The router runs in float32 whatever the compute dtype, as in HF.
        self.gate = Linear(dim, spec.num_experts, False, params_dtype, ms.float32)
        if spec.expert_bias:
            self.expert_bias = Parameter(zeros_tensor((spec.num_experts,), ms.float32), name="expert_bias",
                                         requires_grad=False)
        else:
            self.expert_bias = None
        self.spec = spec
        self.num_experts = spec.num_experts
        self.top_k = spec.top_k
        self.sigmoid = spec.score_func == "sigmoid"
        self.n_group = spec.n_group
        self.topk_group = spec.topk_group
        self.norm_topk_prob = spec.norm_topk_prob
        self.norm_eps = spec.norm_eps
        self.routed_scaling_factor = spec.routed_scaling_factor
        self.group_mask_inf = spec.group_mask_value == float("-inf")
        self.neg_inf = Tensor(float("-inf"), ms.float32)
        self.one = Tensor(1.0, ms.float32)
        self.zero = Tensor(0.0, ms.float32)

    def construct(self, x):
        return router_forward(self, self.expert_bias, x)
