"""Per-request sampling settings, and the on-device token chooser every compiled step ends with.

Each batch row (slot) carries its own settings as small tensors, so requests with different
settings share one decode step: greedy rows take the argmax; sampling rows apply HF's warpers in
HF's order (temperature, then top-k, then top-p on the renormalised top-k distribution) and draw
by inverse CDF over the tokens sorted by probability, with a uniform number `u` in [0, 1) drawn
on the host from the request's own seeded numpy generator. A request's draws therefore do not
depend on which other requests share its batch or which slot it sits in: a seeded request is
reproducible. Only the chosen ids [rows] leave the device, never the logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops


@dataclass(frozen=True)
class SamplingParams:
    """How one request is continued.

    - `max_new_tokens`: generated tokens at most (the stop token, when hit, is not counted or
      returned).
    - `do_sample`: False = greedy (temperature / top_k / top_p unused); True = sample.
    - `temperature` > 0, `top_k` >= 0 (0 = off), `top_p` in (0, 1] (1 = off).
    - `seed`: the request's numpy generator seed (None: fresh entropy).
    - `stop_token_ids`: generation stops when one of these is produced (in addition to the
      engine's default EOS ids unless `ignore_eos`).
    - `logprobs`: None, or N in 0..20: every generated token comes with its log-probability and
      the N most likely tokens' (`Request.output_logprobs`; see logprobs.py).
    - `prompt_logprobs`: None, or N in 0..20: the same for the prompt's tokens
      (`Request.prompt_logprobs`, None for the first).
    """

    max_new_tokens: int = 16
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        self.validate()

    def validate(self) -> None:
        def bad(name: str, rule: str) -> ValueError:
            return ValueError(f"{name}: {rule}, got {getattr(self, name)!r}")

        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise bad("max_new_tokens", "must be an integer >= 1")
        if not isinstance(self.temperature, (int, float)) or isinstance(self.temperature, bool) \
                or not self.temperature > 0 or not np.isfinite(self.temperature):
            raise bad("temperature", "must be a finite number > 0")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or not 0 <= self.top_k < 2**31:
            raise bad("top_k", "must be an integer in [0, 2**31) (0 = off)")
        if not isinstance(self.top_p, (int, float)) or isinstance(self.top_p, bool) or not 0 < self.top_p <= 1 \
                or not np.isfinite(self.top_p):
            raise bad("top_p", "must be in (0, 1]")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise bad("seed", "must be a non-negative integer or null")
        if any(t < 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", "must be non-negative token ids")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 20):
                raise bad(name, "must be null or an integer in 0..20")


class SlotSettings:
    """Host-side arrays of every slot's settings, turned into step inputs in one go."""

    def __init__(self, slots: int):
        self.greedy = np.ones(slots, bool)
        self.temperature = np.ones(slots, np.float32)
        self.top_k = np.zeros(slots, np.int32)
        self.top_p = np.ones(slots, np.float32)
        self.uniform = np.zeros(slots, np.float32)

    def set(self, slot: int, params: SamplingParams) -> None:
        self.greedy[slot] = not params.do_sample
        self.temperature[slot] = params.temperature
        self.top_k[slot] = params.top_k
        self.top_p[slot] = params.top_p

    def clear(self, slot: int) -> None:
        self.greedy[slot] = True

    def tensors(self, rows: Sequence[int] | slice = slice(None)) -> tuple[Tensor, ...]:
        return (Tensor(self.temperature[rows]), Tensor(self.top_k[rows]), Tensor(self.top_p[rows]),
                Tensor(self.uniform[rows]), Tensor(self.greedy[rows]))


class TokenChooser(nn.Cell):
    """Next token per row from logits [rows, V]; `sample=False` compiles the argmax alone."""

    def __init__(self, vocab_size: int, sample: bool):
        super().__init__()
        self.sample = sample
        self.vocab_size = vocab_size
        self.ranks = Tensor(np.arange(vocab_size, dtype=np.int32).reshape(1, -1))

    def construct(self, logits, temperature, top_k, top_p, uniform, greedy):
        best = ops.argmax(logits, -1).astype(ms.int32)
        if not self.sample:
            return best
        scaled = logits / temperature.reshape(-1, 1)
        ordered, order = ops.sort(scaled, -1, descending=True)
        k = ops.where(top_k > 0, top_k, self.vocab_size).reshape(-1, 1)
        keep = self.ranks < k
        ordered = ops.masked_fill(ordered, ops.logical_not(keep), float("-inf"))
        probs = ops.softmax(ordered, -1)                          # renormalised over the top-k
        before = ops.cumsum(probs, -1) - probs                     # mass of the more likely tokens
        keep = ops.logical_and(keep, before < top_p.reshape(-1, 1))  # the most likely always stays
        probs = ops.masked_fill(probs, ops.logical_not(keep), 0.0)
        cdf = ops.cumsum(probs, -1)
        threshold = uniform.reshape(-1, 1) * cdf[:, -1:]
        index = ops.minimum(ops.reduce_sum((cdf <= threshold).astype(ms.int32), -1), self.vocab_size - 1)
        drawn = ops.gather_d(order, 1, index.reshape(-1, 1)).reshape(-1).astype(ms.int32)
        return ops.where(greedy, best, drawn)
