"""GPT-2: learned positions, pre-LayerNorm blocks of biased multi-head attention and a GELU MLP,
the head tied to the token embedding.

Parameters: tok_embeddings (wte), pos_embeddings (wpe), layers.{i}.attention_norm / ffn_norm
(LayerNorm weight + bias), layers.{i}.attention.wq/wk/wv/wo (weight + bias, [out, in]: mf-ckpt
transposes HF's Conv1D [in, out] and unpacks c_attn), layers.{i}.feed_forward.w1 (c_fc) / w2
(c_proj) with biases, norm (ln_f, weight + bias), and output only when untied. The blocks are
Llama's (llama/model.py) with LayerNorms, no rotary embedding and the GELU MLP.
"""

from __future__ import annotations

from ..common.layers import Embedding, GeluFeedForward, LayerNorm
from ..llama.model import Attention, GQACausalLM, TransformerBlock
from .args import Gpt2Args


class Gpt2Attention(Attention):
    """Llama's attention with biases everywhere (args.qkv_bias / o_bias) and no rotary embedding."""

    def scale(self, args: Gpt2Args, layer_id: int) -> float:
        scale = self.head_dim ** -0.5 if args.scale_attn_weights else 1.0
        return scale / (layer_id + 1) if args.scale_attn_by_inverse_layer_idx else scale

    def rotate(self, x, cos, sin):
        return x


class GPT2LMHeadModel(GQACausalLM):
    def __init__(self, args: Gpt2Args):
        def block(i, cdt, pdt):
            return TransformerBlock(args, i, cdt, pdt, Gpt2Attention,
                                    norm=lambda dim: LayerNorm(dim, args.layer_norm_epsilon, pdt),
                                    feed_forward=GeluFeedForward(args.hidden_size, args.intermediate_size,
                                                                 args.activation_function, pdt, cdt))

        super().__init__(args, 0, block)
        self.pos_embeddings = Embedding(args.max_position_embeddings, args.hidden_size, self.params_dtype)
        self.norm = LayerNorm(args.hidden_size, args.layer_norm_epsilon, self.params_dtype)

    def embed(self, input_ids, position_ids):
        return (self.tok_embeddings(input_ids) + self.pos_embeddings(position_ids)).astype(self.compute_dtype)
