"""GLM (GLM-4-9B): Llama's pre-norm block with GLM-4's attention (glm4/model.py: q/k/v biases,
RoPE over the first half of each head in interleaved pairs). Parameters: Llama's names, q/k/v
biases when attention_bias."""

from __future__ import annotations

from ..glm4.model import Glm4Attention
from ..llama.model import GQACausalLM, TransformerBlock
from .args import GlmArgs


class GlmForCausalLM(GQACausalLM):
    def __init__(self, args: GlmArgs):
        super().__init__(args, args.rotary_dim, lambda i, cdt, pdt: TransformerBlock(args, i, cdt, pdt, Glm4Attention))
