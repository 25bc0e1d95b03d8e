"""Qwen2's parallel plan: Llama's (the q/k/v biases are sliced with their column-parallel rows)."""

from __future__ import annotations

from ..common.parallel import ParallelOptions
from ..llama.parallelize import parallelize_dense


def parallelize_qwen2(model, mesh, options: ParallelOptions | None = None):
    """Shard `model` (a Qwen2ForCausalLM) in place for `mesh`; returns it. Before the first call."""
    return parallelize_dense(model, mesh, options or ParallelOptions(), "qwen2")
