"""Log-probabilities of tokens, for requests that ask for them (OpenAI's `logprobs`, `echo`).

A request with `SamplingParams.logprobs = N` gets, with every generated token, that token's
log-probability and the N most likely tokens with theirs; `prompt_logprobs = N` adds the same for
every prompt token after the first (the first has no context to be predicted from). They are the
log-probabilities of the distribution the token was drawn from after temperature, over the whole
vocabulary: `log_softmax(logits / temperature)` (temperature 1 for greedy rows), top-k / top-p
truncation not applied, as vLLM documents for its default.

The engine computes them on the device in the same compiled call that chooses the token, and only
[rows] + [rows, MAX_LOGPROBS] numbers leave it, never the logits:

- `LogprobChooser` wraps the `TokenChooser` a step ends with: (tokens, chosen logprob, top ids,
  top logprobs). A decode step built with it serves logprob and plain rows alike.
- `ScoringPrefillStep` is the prefill of a request that scores its prompt: one forward over the
  prompt (its keys fill the slot as `PrefillStep`'s do), the head applied at every position, the
  logprob of each next prompt token and the top ones, and the first generated token as usual.
"""

from __future__ import annotations

from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from ..common.transformer import CausalLM
from .cache import PrefillView
from .sampling import TokenChooser

MAX_LOGPROBS = 20   # top alternatives a request may ask for (vLLM's default max_logprobs)


@dataclass(frozen=True)
class TokenLogprob:
    """One token's log-probability and the most likely tokens at its position (id, logprob),
    most likely first, as many as the request asked for."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def log_softmax(logits):
    """log_softmax over the last axis in float64, written out: MindSpore's CPU LogSoftmax kernel is
    off by ~2e-6 (in float32 and float64 alike: log_softmax([0.1, 0.2, 0.3]) gives -1.2019409 for
    -1.2019429), which summed over a continuation's tokens would reach lm-eval's tolerances; this
    is exact to float64 rounding (1e-15 against numpy on the same logits)."""
    logits = logits.astype(ms.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - ops.log(ops.exp(shifted).sum(-1, keepdims=True))


def _log_softmax(logits, temperature, greedy):
    """log_softmax(logits / t) per row, t = 1 on greedy rows (float64)."""
    t = ops.where(greedy, ops.ones_like(temperature), temperature).reshape(-1, 1)
    return log_softmax(logits.astype(ms.float32) / t)


class LogprobChooser(nn.Cell):
    """(tokens [rows], their logprobs [rows], top ids [rows, K], top logprobs [rows, K])."""

    def __init__(self, chooser: TokenChooser, k: int = MAX_LOGPROBS):
        super().__init__()
        self.chooser = chooser
        self.k = min(k, chooser.vocab_size)

    def construct(self, logits, temperature, top_k, top_p, uniform, greedy):
        tokens = self.chooser(logits, temperature, top_k, top_p, uniform, greedy)
        logp = _log_softmax(logits, temperature, greedy)
        chosen = ops.gather_d(logp, 1, tokens.reshape(-1, 1)).reshape(-1)
        top_logp, top_ids = ops.topk(logp, self.k)
        return tokens, chosen, top_ids.astype(ms.int32), top_logp


class ScoringPrefillStep(nn.Cell):
    """ids [1, Pb] (right-padded), targets [Pb] (ids shifted left by one) -> the first token's
    (token, logprob, top ids, top logprobs), then per prompt position p the logprob of
    targets[p] [Pb] and the top ids / logprobs [Pb, K]. Positions past the prompt are padding."""

    def __init__(self, model: CausalLM, view: PrefillView, chooser: LogprobChooser):
        super().__init__(auto_prefix=False)  # the model's parameter names stay unprefixed
        self.model, self.view, self.chooser = model, view, chooser
        self.phase = "prefill"   # called without the per-call compile check, as PrefillStep (steps.py)

    def construct(self, ids, targets, slot, last, temperature, top_k, top_p, uniform, greedy):
        self.view.set_inputs(slot)
        h = self.model.hidden_states(ids, self.view.positions, None, self.view)    # [1, Pb, H]
        logits = self.model.head(h)[0]                                               # [Pb, V]
        token, logprob, top_ids, top_logp = self.chooser(ops.gather(logits, last, 0), temperature, top_k, top_p,
                                                         uniform, greedy)
        rows = logits.shape[0]
        logp = _log_softmax(logits, ops.broadcast_to(temperature, (rows,)), ops.broadcast_to(greedy, (rows,)))
        prompt = ops.gather_d(logp, 1, targets.reshape(-1, 1)).reshape(-1)
        prompt_top_logp, prompt_top_ids = ops.topk(logp, self.chooser.k)
        return token, logprob, top_ids, top_logp, prompt, prompt_top_ids.astype(ms.int32), prompt_top_logp


def entry(token: int, logprob: float, top_ids: np.ndarray, top_logprobs: np.ndarray, n: int) -> TokenLogprob:
    """A TokenLogprob from one row of a step's outputs, keeping the request's n alternatives."""
    return TokenLogprob(int(token), float(logprob),
                        tuple((int(i), float(p)) for i, p in zip(top_ids[:n], top_logprobs[:n])))


def prompt_entries(prompt_ids: list[int], scores: np.ndarray, top_ids: np.ndarray, top_logprobs: np.ndarray,
                   n: int) -> list[TokenLogprob | None]:
    """The prompt's logprobs from a ScoringPrefillStep's outputs: None for the first token, then
    token i's logprob as predicted at position i - 1."""
    out: list[TokenLogprob | None] = [None]
    for i in range(1, len(prompt_ids)):
        out.append(entry(prompt_ids[i], scores[i - 1], top_ids[i - 1], top_logprobs[i - 1], n))
    return out
