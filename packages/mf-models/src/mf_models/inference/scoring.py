"""Teacher-forced scoring of token sequences in batches: the log-likelihood of a continuation given
its context, as evaluation harnesses ask for it (lm-evaluation-harness' `loglikelihood`).

    scorer = Scorer(model, batch_size=8, max_len=2048)
    results = scorer.score([(context_ids + continuation_ids, len(continuation_ids)), ...])
    results[0].logprobs      # [len(continuation)] float: log p(token | everything before it)
    results[0].greedy        # every continuation token was the argmax at its position

One forward over `tokens[:-1]` predicts every next token; the last `n` predictions are the
continuation's. Sequences are sorted by length, cut into batches of `batch_size` rows, right-padded
to a length bucket (padding sits after the real tokens, so a causal model never sees it) and the
batch filled with empty rows: in GRAPH_MODE one compile per bucket, reused for the whole run. Only
[rows, length] numbers leave the device, never the logits. Log-probabilities are the model's own
(log_softmax of the logits, no temperature, in float64). A sequence longer than `max_len` + 1 keeps its last
`max_len` + 1 tokens (the context is cut on the left, as harnesses do).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from ..common.transformer import CausalLM
from ..generation import _synchronous_pynative
from .logprobs import log_softmax
from .scheduler import length_buckets, pick_bucket


class SequenceScorer(nn.Cell):
    """ids [B, L], targets [B, L] -> (log p(targets) [B, L], targets are the argmax [B, L])."""

    def __init__(self, model: CausalLM):
        super().__init__(auto_prefix=False)  # the model's parameter names stay unprefixed
        self.model = model

    def construct(self, ids, targets):
        logits = self.model(ids)                                              # [B, L, V] float32
        logp = log_softmax(logits)                                            # float64
        chosen = ops.gather_d(logp, 2, targets.expand_dims(-1)).squeeze(-1)
        greedy = ops.equal(ops.argmax(logits, -1).astype(ms.int32), targets)
        return chosen, greedy


@dataclass
class Scored:
    logprobs: np.ndarray     # [n] float64: each continuation token's log-probability
    greedy: bool             # every continuation token was the most likely one

    @property
    def total(self) -> float:
        return float(np.sum(self.logprobs, dtype=np.float64))


class Scorer:
    """Batched teacher-forced scoring of (tokens, n) pairs with `model` (see the module docstring)."""

    def __init__(self, model: CausalLM, *, batch_size: int = 8, max_len: int | None = None, min_bucket: int = 16):
        limit = model.args.max_position_embeddings
        self.max_len = min(limit, max_len or limit)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"Scorer: batch_size must be a positive integer, got {batch_size!r}")
        self.batch_size = batch_size
        self.buckets = length_buckets(min(min_bucket, self.max_len), self.max_len)
        self.cell = SequenceScorer(model)
        self.model = model

    def score(self, items: Sequence[tuple[Sequence[int], int]],
              progress: Callable[[int], None] | None = None) -> list[Scored]:
        """Scores in the order given; `progress(k)` after each batch of k items."""
        prepared = []
        for tokens, n in items:
            tokens = [int(t) for t in tokens]
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(tokens) - 1:
                raise ValueError(f"Scorer: {n!r} continuation tokens of a {len(tokens)}-token sequence cannot be "
                                 "scored (at least one, and the first token has no context)")
            tokens = tokens[-(self.max_len + 1):]
            prepared.append((tokens, min(n, len(tokens) - 1)))
        order = sorted(range(len(prepared)), key=lambda i: -len(prepared[i][0]))
        out: list[Scored | None] = [None] * len(prepared)
        was_training = self.model.training
        self.model.set_train(False)
        try:
            with _synchronous_pynative():
                for start in range(0, len(order), self.batch_size):
                    rows = order[start:start + self.batch_size]
                    for i, scored in zip(rows, self._batch([prepared[i] for i in rows])):
                        out[i] = scored
                    if progress is not None:
                        progress(len(rows))
        finally:
            self.model.set_train(was_training)
        return out  # type: ignore[return-value]

    def _batch(self, batch: list[tuple[list[int], int]]) -> list[Scored]:
        length = pick_bucket(self.buckets, max(len(tokens) - 1 for tokens, _ in batch))
        ids = np.zeros((self.batch_size, length), np.int32)
        targets = np.zeros((self.batch_size, length), np.int32)
        for row, (tokens, _) in enumerate(batch):
            ids[row, :len(tokens) - 1] = tokens[:-1]
            targets[row, :len(tokens) - 1] = tokens[1:]
        chosen, greedy = (t.asnumpy() for t in self.cell(Tensor(ids), Tensor(targets)))
        scored = []
        for row, (tokens, n) in enumerate(batch):
            end = len(tokens) - 1
            scored.append(Scored(chosen[row, end - n:end].copy(), bool(greedy[row, end - n:end].all())))
        return scored
