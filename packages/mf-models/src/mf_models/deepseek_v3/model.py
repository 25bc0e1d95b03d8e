"""DeepSeek-V3: multi-head latent attention (MLA) and DeepSeek MoE blocks.

MLA for hidden states x:
    q            = wq(x)  or  wq_b(q_norm(wq_a(x)))             -> [B, S, heads, nope + rope]
    c_kv, k_rope = split(wkv_a(x), [kv_lora_rank, rope])         (k_rope shared by all heads)
    k_nope, v    = split(wkv_b(kv_norm(c_kv)), [nope, v_head])   per head
    q_rope, k_rope rotated (de-interleaved first when rope_interleave); scores scaled by
    qk_head_dim^-0.5 (times mscale^2 under yarn with mscale_all_dim).
Layers i < first_k_dense_replace use a dense SwiGLU `feed_forward`, the others `moe`.

Sharding hooks (no parallel code here): heads come from the tensors, so a TP plan shards
`wq`/`wq_b` and `wkv_b` by heads (column) and `wo` by rows, keeping the small latent projections
`wq_a`/`wkv_a` and their norms replicated; experts are stacked [E, out, in] for expert parallelism.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import mint, nn, ops

from ..common.attention import CoreAttention
from ..common.balancing import BalanceSpec
from ..common.layers import Linear, RMSNorm
from ..common.moe import MoE
from ..common.rope import apply_rotary, deinterleave, softmax_mscale
from ..common.router import RouterSpec
from ..common.transformer import CausalLM
from ..llama import model as llama_model
from .args import DeepseekV3Args


class Attention(nn.Cell):
    def __init__(self, args: DeepseekV3Args, layer_id: int, compute_dtype: ms.Type, params_dtype: ms.Type):
        super().__init__()
        dim, heads = args.hidden_size, args.num_attention_heads
        self.layer_id = layer_id
        self.nope, self.rope, self.v_dim = args.qk_nope_head_dim, args.qk_rope_head_dim, args.v_head_dim
        self.qk_dim = args.qk_head_dim
        self.kv_lora_rank = args.kv_lora_rank
        self.q_lora = args.q_lora_rank is not None
        lin = {"params_dtype": params_dtype, "compute_dtype": compute_dtype}
        if self.q_lora:
            self.wq_a = Linear(dim, args.q_lora_rank, **lin)
            self.q_norm = RMSNorm(args.q_lora_rank, args.rms_norm_eps, params_dtype)
            self.wq_b = Linear(args.q_lora_rank, heads * self.qk_dim, **lin)
        else:
            self.wq = Linear(dim, heads * self.qk_dim, **lin)
        self.wkv_a = Linear(dim, self.kv_lora_rank + self.rope, **lin)
        self.kv_norm = RMSNorm(self.kv_lora_rank, args.rms_norm_eps, params_dtype)
        self.wkv_b = Linear(self.kv_lora_rank, heads * (self.nope + self.v_dim), **lin)
        self.wo = Linear(heads * self.v_dim, dim, **lin)
        self.interleave = args.rope_interleave
        scale = self.qk_dim ** -0.5 * softmax_mscale(args.rope)
        self.core = CoreAttention(scale, args.use_flash_attention, compute_dtype)

    def construct(self, x, cos, sin, mask, cache=None):
        b, s, _ = x.shape
        if self.q_lora:
            q = self.wq_b(self.q_norm(self.wq_a(x)))
        else:
            q = self.wq(x)
        q = q.reshape(b, s, -1, self.qk_dim).transpose(0, 2, 1, 3)  # [B, heads, S, qk]
        q_nope, q_rope = ops.split(q, [self.nope, self.rope], -1)
        c_kv, k_rope = ops.split(self.wkv_a(x), [self.kv_lora_rank, self.rope], -1)
        kv = self.wkv_b(self.kv_norm(c_kv)).reshape(b, s, -1, self.nope + self.v_dim).transpose(0, 2, 1, 3)
        k_nope, v = ops.split(kv, [self.nope, self.v_dim], -1)
        k_rope = k_rope.reshape(b, 1, s, self.rope)
        if self.interleave:
            q_rope = deinterleave(q_rope)
            k_rope = deinterleave(k_rope)
        q_rope = apply_rotary(q_rope, cos, sin)
        k_rope = ops.broadcast_to(apply_rotary(k_rope, cos, sin), k_nope.shape[:-1] + (self.rope,))
        q = mint.cat((q_nope, q_rope), -1)
        k = mint.cat((k_nope, k_rope), -1)
        if cache is not None:
            k, v = cache.update(self.layer_id, k, v)
        out = self.core(q, k, v, mask)
        return self.wo(out.transpose(0, 2, 1, 3).reshape(b, s, -1))


def router_spec(args: DeepseekV3Args, group_mask_value: float = 0.0) -> RouterSpec:
    """DeepSeek-V3's router (HF DeepseekV3TopkRouter + DeepseekV3MoE.route_tokens_to_experts); GLM-4.5
    routes the same way but gives the experts of unchosen groups -inf (`group_mask_value`)."""
    return RouterSpec(args.n_routed_experts, args.num_experts_per_tok, "sigmoid", expert_bias=True,
                      n_group=args.n_group, topk_group=args.topk_group, norm_topk_prob=args.norm_topk_prob,
                      norm_eps=1e-20, routed_scaling_factor=args.routed_scaling_factor,
                      group_mask_value=group_mask_value)


def deepseek_moe(args, compute_dtype: ms.Type, params_dtype: ms.Type, group_mask_value: float = 0.0) -> MoE:
    """A DeepSeek MoE block's feed-forward (routed + shared experts), GLM-4.5's too."""
    return MoE(args.hidden_size, args.moe_intermediate_size, router_spec(args, group_mask_value),
               args.moe_intermediate_size * args.n_shared_experts, balance_spec(args).active, params_dtype,
               compute_dtype)


def balance_spec(args: DeepseekV3Args) -> BalanceSpec:
    """The sequence-wise (seq_aux) or batch-wise balance loss weighted by aux_loss_alpha."""
    if args.aux_loss_alpha == 0:
        return BalanceSpec()
    return BalanceSpec("sequence" if args.seq_aux else "batch", args.aux_loss_alpha)


class TransformerBlock(llama_model.TransformerBlock):
    """Llama's pre-norm block with MLA, and the MoE from layer first_k_dense_replace on (a dense
    SwiGLU without biases below)."""

    def __init__(self, args: DeepseekV3Args, layer_id: int, compute_dtype: ms.Type, params_dtype: ms.Type):
        moe = deepseek_moe(args, compute_dtype, params_dtype) if layer_id >= args.first_k_dense_replace else None
        super().__init__(args, layer_id, compute_dtype, params_dtype, attention_cls=Attention, moe=moe, mlp_bias=False)


class DeepseekV3ForCausalLM(CausalLM):
    """`mtp`: build the `num_nextn_predict_layers` multi-token-prediction modules (training)."""

    def __init__(self, args: DeepseekV3Args, mtp: bool = False):
        super().__init__(args, args.qk_rope_head_dim,
                         lambda i, cdt, pdt: TransformerBlock(args, i, cdt, pdt),
                         mtp_layers=args.num_nextn_predict_layers if mtp else 0)
        self.balance = balance_spec(args)
        self.num_experts = args.n_routed_experts
        self.top_k = args.num_experts_per_tok

    def attention_flops_dims(self) -> tuple[int, int, int]:
        return self.args.num_attention_heads, self.args.qk_head_dim, self.args.v_head_dim

    def kv_cache_shapes(self) -> tuple[tuple[int, int], tuple[int, int]]:
        return (self.args.num_attention_heads, self.args.qk_head_dim), (self.args.num_attention_heads, self.args.v_head_dim)
