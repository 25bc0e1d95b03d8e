"""Qwen2: Llama's block with biased q/k/v projections (`attention.wq/wk/wv.bias`)."""

from __future__ import annotations

from ..llama.model import GQACausalLM, TransformerBlock
from .args import Qwen2Args


class Qwen2ForCausalLM(GQACausalLM):
    def __init__(self, args: Qwen2Args):
        super().__init__(args, args.head_dim, lambda i, cdt, pdt: TransformerBlock(args, i, cdt, pdt))
