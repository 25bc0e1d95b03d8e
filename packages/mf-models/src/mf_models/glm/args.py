"""GLM hyper-parameters (HF `GlmConfig` names; defaults are HF's, the same as GLM-4's)."""

from __future__ import annotations

from dataclasses import dataclass

from ..glm4.args import Glm4Args


@dataclass
class GlmArgs(Glm4Args):
    """GLM-4-9B (GlmForCausalLM; THUDM's ChatGLM architecture, also ChatGLM2/3-6B's): GLM-4-0414's
    attention (q/k/v biases, partial interleaved RoPE, GQA) and SwiGLU MLP in plain pre-norm blocks,
    without GLM-4-0414's norms after the attention and the MLP. Keys and defaults as glm4/args.py."""
