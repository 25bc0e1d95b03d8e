"""The dispatcher's block arithmetic (dispatch.py), free of MindSpore: the parameter and activation
inventory (`mf plan`) sizes the dispatched rows and gathered weight blocks with the same numbers."""

from __future__ import annotations


def rows_per_block(assignments: int, num_experts: int) -> int:
    """Default block height: a quarter of the mean load per expert (at least 1)."""
    return max(1, -(-assignments // (4 * num_experts)))


def max_blocks(assignments: int, num_experts: int, block: int) -> int:
    """Static bound on the blocks any routing of `assignments` over `num_experts` needs."""
    return (assignments + min(num_experts, assignments) * (block - 1)) // block
