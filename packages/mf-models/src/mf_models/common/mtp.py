"""Multi-token prediction (MTP): DeepSeek-V3's sequential prediction modules (section 2.2 of its
report), as Megatron-Core trains them and transformers' MtpLayer runs them.

Module k (1..D) predicts token i + k + 1 at position i from the representation of depth k - 1
(depth 0: the main model's hidden states after its final norm) and the embedding of token i + k:

    h_k = norm_k( block_k( eh_proj( [enorm_k(Emb(t_{i+k})) ; hnorm_k(h_{k-1})] ) ) )
    logits_k = head(h_k)              (the main model's embedding and output head, shared)

`block_k` is a decoder block of the model's own kind (DeepSeek-V3 / GLM-4.5: a MoE block), run with
the main sequence's rotary tables and mask; the token ids are shifted left once per depth, the
positions past the end filled with id 0 (their labels are masked out: `shift_left`). Parameter
names: mtp.{k - 1}.enorm / hnorm / eh_proj [H, 2H] / norm (HF's shared_head.norm), and the block's
names under mtp.{k - 1}.block. The shifted tokens are looked up in `mtp_embeddings`, an Embedding
leaf whose weight IS the token table (one Parameter, `tok_embeddings.weight`): a parallel plan then
treats it as a leaf sharing the table (vocab-parallel under tp, sharded once by FSDP), and a
pipeline's last stage holds it as the first stage holds the table (their gradients summed, as for
tied embeddings). (mf-ckpt converts them to and from the HF checkpoint's layer
`num_hidden_layers + k - 1`.)

The loss of depth k is the masked cross entropy of logits_k against the labels shifted left k
times (the loss mask shifted with them, zero past the end), over its own token count; the training
objective adds `mtp_loss_scaling_factor / D` times their sum (Megatron-Core's
`mtp_loss_scaling_factor / mtp_num_layers`, DeepSeek's lambda / D). The MTP blocks' MoE layers
route like the decoder's: their routing statistics follow the decoder's rows, their balance loss
joins the model's, and their expert biases move with the rest.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import mint, nn, ops

from .layers import Linear, RMSNorm


def shift_left(x):
    """[B, S, ...] -> x[:, 1:] followed by zeros: token / label / mask of the next position."""
    return mint.cat((x[:, 1:], ops.zeros_like(x[:, :1])), 1)


class MTPModule(nn.Cell):
    """One prediction depth: (h_{k-1} [B, S, H], embeddings of the shifted tokens [B, S, H]) ->
    h_k after its norm (plus the block's routing statistics when it is a MoE block)."""

    def __init__(self, args, block: nn.Cell, params_dtype: ms.Type, compute_dtype: ms.Type):
        super().__init__()
        dim = args.hidden_size
        self.enorm = RMSNorm(dim, args.rms_norm_eps, params_dtype)
        self.hnorm = RMSNorm(dim, args.rms_norm_eps, params_dtype)
        self.eh_proj = Linear(2 * dim, dim, False, params_dtype, compute_dtype)
        self.block = block
        self.norm = RMSNorm(dim, args.rms_norm_eps, params_dtype)
        self.moe_enabled = bool(getattr(block, "moe_enabled", False))

    def construct(self, h, e, cos, sin, mask):
        x = self.eh_proj(mint.cat((self.enorm(e), self.hnorm(h)), -1))
        if self.moe_enabled:
            x, load, counts, aux_counts, aux_sums = self.block(x, cos, sin, mask, None)
            return self.norm(x), load, counts, aux_counts, aux_sums
        return self.norm(self.block(x, cos, sin, mask, None))


def run_mtp(embeddings, compute_dtype, modules, input_ids, h, cos, sin, mask, loads, counts, aux_counts, aux_sums):
    """The depths of `modules` after the main model's final-norm hidden states `h`, the shifted
    tokens looked up in `embeddings` (the model's `mtp_embeddings`: the token table, shared): a
    tuple of their hidden states, and the routing lists extended by their MoE blocks' statistics."""
    outs = ()
    ids = input_ids
    for module in modules:
        ids = shift_left(ids)
        e = embeddings(ids).astype(compute_dtype)
        if module.moe_enabled:
            h, load, count, aux_count, aux_sum = module(h, e, cos, sin, mask)
            loads.append(load)
            counts.append(count)
            aux_counts.append(aux_count)
            aux_sums.append(aux_sum)
        else:
            h = module(h, e, cos, sin, mask)
        outs = outs + (h,)
    return outs, loads, counts, aux_counts, aux_sums
