"""GLM's parallel plan: Llama's (its attention's heads and biases split like Llama's, the rotary
part of each local head rotated as one process rotates it)."""

from __future__ import annotations

from ..common.parallel import ParallelOptions
from ..llama.parallelize import parallelize_dense


def parallelize_glm(model, mesh, options: ParallelOptions | None = None):
    """Shard `model` (a GlmForCausalLM) in place for `mesh`; returns it. Before the first call."""
    return parallelize_dense(model, mesh, options or ParallelOptions(), "glm")
