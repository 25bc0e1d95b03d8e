"""Dropless token dispatch for the stacked experts: static shapes, no capacity, no dropping.

Each of the T tokens picks k experts: N = T*k (token, expert) assignments. The local dispatcher
lays them out in expert order, in *blocks* of `b` rows that each belong to one expert:

    assignment a (token a // k, expert e_a)  ->  row  starts[e_a] * b + (rank of a among e's)
    expert e owns ceil(n_e / b) consecutive blocks; blocks after the last used one are empty

so every assignment has its own row (dropless by construction) and the row count is bounded
statically: sum_e ceil(n_e / b) <= (N + min(E, N) * (b - 1)) // b blocks whatever the routing.
The experts then run one batched matmul over the blocks, each block with its expert's weights
(`GroupedExperts`): about N + E*b rows of work instead of the dense path's E*T, and no data-dependent
shape, so the same graph compiles once in GRAPH_MODE. The default b = ceil(N / 4E) (a quarter of
the mean load) bounds the rows by 1.25 N + E and the gathered weight blocks by 5E: on CPU
(benchmarks/moe_bench.py, fwd + bwd) b = N/4E ran 1.3-1.4x faster than b = N/E (fewer padding
rows outweigh the extra weight gathers); larger b saves the memory of the gathered weights.

The layout is pure index arithmetic on one-hot counts (cumsum, gather, scatter of unique rows):
deterministic, and its gradients are gathers and segment sums. `combine` gathers each
assignment's output row back, weights it and sums a token's k rows.

Interface for expert parallelism: `dispatch(tokens [T, H], topk_idx [T, k])` -> rows for the
experts, and `combine(expert_rows, handle, topk_weights)` -> tokens [T, H]. An all-to-all
dispatcher (counts first, then the rows each rank's experts own; combine by the reverse exchange)
replaces `moe.dispatcher` with the same two calls, and hands the experts rows whose block ids are
local to the rank.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import Tensor, nn, ops

from .blocks import max_blocks, rows_per_block  # noqa: F401  (pure arithmetic, shared with the inventory)


class LocalDispatcher(nn.Cell):
    """Dispatch/combine on one rank (all experts local). No parameters."""

    def __init__(self, num_experts: int, top_k: int, block: int | None = None):
        super().__init__()
        self.num_experts = num_experts
        self.top_k = top_k
        self.block = block          # None: rows_per_block(T * k, E) for each input size
        self.one = Tensor(1, ms.int32)
        self.zero = Tensor(0, ms.int32)

    def layout_sizes(self, tokens: int) -> tuple[int, int]:
        """(block height b, number of blocks) for `tokens` tokens: static."""
        n = tokens * self.top_k
        b = self.block or rows_per_block(n, self.num_experts)
        return b, max_blocks(n, self.num_experts, b)

    def dispatch(self, x, topk_idx):
        """x [T, H], topk_idx [T, k] int32 -> (rows [nb*b, H], block_expert [nb] int32,
        handle = dest [N] int32 (each assignment's row), tokens_per_expert [E] float32,
        counts [2] float32 = (dropped assignments, padding rows))."""
        tokens, hidden = x.shape
        k, experts = self.top_k, self.num_experts
        n = tokens * k
        b, nb = self.layout_sizes(tokens)
        flat = topk_idx.reshape(n)
        one_hot = ops.one_hot(flat, experts, self.one, self.zero)                   # [N, E]
        counts = one_hot.sum(0)                                                      # [E]
        rank_in_expert = (ops.cumsum(one_hot, 0) * one_hot).sum(1) - 1               # [N]
        blocks = (counts + (b - 1)) // b
        ends = ops.cumsum(blocks, 0)
        dest = ops.gather(ends - blocks, flat, 0) * b + rank_in_expert               # [N]
        assignment = ops.arange(0, n, dtype=ms.int32)
        # Rows without an assignment read token T, a zero row appended to x.
        row_token = ops.scatter_nd(dest.reshape(n, 1), assignment // k + 1, (nb * b,)) - 1
        row_token = ops.where(row_token < 0, ops.full_like(row_token, tokens), row_token)
        x_ext = ops.concat((x, ops.zeros((1, hidden), x.dtype)), 0)
        rows = ops.gather(x_ext, row_token, 0)
        block_ids = ops.arange(0, nb, dtype=ms.int32).reshape(nb, 1)
        block_expert = ops.minimum((ends.reshape(1, experts) <= block_ids).astype(ms.int32).sum(1), experts - 1)
        filled = (row_token < tokens).astype(ms.float32).sum()
        stats = ops.stack((n - filled, nb * b - filled))
        return rows, block_expert, dest, ops.stop_gradient(counts.astype(ms.float32)), ops.stop_gradient(stats)

    def combine(self, expert_rows, dest, topk_weights):
        """expert_rows [nb*b, H] (compute dtype), dest [N], topk_weights [T, k] float32 -> [T, H]."""
        tokens, k = topk_weights.shape
        picked = ops.gather(expert_rows, dest, 0).astype(ms.float32)                 # [N, H]
        weighted = picked * topk_weights.reshape(tokens * k, 1)
        return weighted.reshape(tokens, k, -1).sum(1).astype(expert_rows.dtype)
