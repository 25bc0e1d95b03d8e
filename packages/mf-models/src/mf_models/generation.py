"""Autoregressive generation: prefill the prompt, then one token per step through a KV cache.

Batches are equal-length prompts, or left-padded prompts with `padding_mask` (1 = real token,
0 = padding, HF's attention_mask convention): padded keys are masked and positions count real
tokens only, as HF does. Greedy decoding reproduces HF's `generate(do_sample=False)`; sampling
applies HF's warpers in HF's order (temperature, top-k, top-p) with a numpy generator seeded by
`seed` (reproducible here, not bit-identical to torch's sampler). A row that emits an EOS token is
padded with `pad_token_id` afterwards; generation stops when every row has finished.

Runs in the context's mode. Shapes are fixed per call: the cached path has one prefill shape
[B, P] and one decode shape [B, 1] (two graphs in GRAPH_MODE, reused for every step and kept for
the next call with the same model and sizes); `use_cache=False` recomputes a fixed [B, P + n]
buffer every step (positions past the current token are causally invisible), one graph.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from .common.attention import KVCache
from .common.transformer import CausalLM


@contextmanager
def synchronous_pynative() -> Iterator[None]:
    # Decoding is hundreds of tiny ops per token. MindSpore's asynchronous PyNative pipeline spends
    # far more on thread hand-offs than on the ops (measured on 2 busy cores: 10 tokens of the
    # DeepSeek fixture 20 s async vs 0.5 s synchronous), so run them synchronously for the call.
    if ms.get_context("mode") != ms.PYNATIVE_MODE or ms.get_context("pynative_synchronize"):
        yield
        return
    ms.set_context(pynative_synchronize=True)
    try:
        yield
    finally:
        ms.set_context(pynative_synchronize=False)


class _CachedStep(nn.Cell):
    """Logits of the last position, with the KV cache bound (so a compiled graph owns it)."""

    def __init__(self, model: CausalLM, cache: KVCache):
        super().__init__(auto_prefix=False)  # keep the model's parameter names unprefixed
        self.model = model
        self.cache = cache

    def construct(self, input_ids, position_ids, attention_mask=None):
        return self.model(input_ids, position_ids, attention_mask, self.cache)[:, -1]


class _FullStep(nn.Cell):
    """Logits at `index` [1] of a full forward over the whole (fixed-size) buffer."""

    def __init__(self, model: CausalLM):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, input_ids, position_ids, index, attention_mask=None):
        return ops.gather(self.model(input_ids, position_ids, attention_mask), index, 1)[:, 0]


# The steps of the last generate call: a GRAPH_MODE caller generating again with the same model
# and sizes reuses the compiled graphs (one entry, so at most one model is held).
_last_steps: dict[tuple, nn.Cell] = {}


def _step_for(model: CausalLM, use_cache: bool, batch: int, total: int) -> nn.Cell:
    key = (id(model), use_cache, batch, total)
    step = _last_steps.get(key)
    if step is None:
        if use_cache:
            k_shape, v_shape = model.kv_cache_shapes()
            cache = KVCache(len(model.layers), batch, total, k_shape, v_shape, model.compute_dtype)
            step = _CachedStep(model, cache)
        else:
            step = _FullStep(model)
        _last_steps.clear()
        _last_steps[key] = step
    if use_cache:
        step.cache.reset()
    return step


def _warp(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    logits = logits / temperature
    if top_k > 0:
        k = min(top_k, logits.shape[-1])
        kth = np.sort(logits, axis=-1)[:, -k][:, None]
        logits = np.where(logits < kth, -np.inf, logits)
    if top_p < 1.0:
        order = np.argsort(logits, axis=-1, kind="stable")  # ascending, as HF
        sorted_logits = np.take_along_axis(logits, order, -1)
        probs = np.exp(sorted_logits - sorted_logits[:, -1:])
        cumulative = np.cumsum(probs / probs.sum(-1, keepdims=True), axis=-1)
        remove_sorted = cumulative <= 1 - top_p
        remove_sorted[:, -1] = False  # always keep the most likely token
        remove = np.zeros_like(remove_sorted)
        np.put_along_axis(remove, order, remove_sorted, -1)
        logits = np.where(remove, -np.inf, logits)
    return logits


def _sample(logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    u = rng.random((logits.shape[0], 1))
    return np.minimum((np.cumsum(probs, -1) < u).sum(-1), logits.shape[-1] - 1)


def _left_padding_positions(padding_mask: np.ndarray) -> np.ndarray:
    if not np.array_equal(padding_mask, np.sort(padding_mask, axis=-1)):
        raise ValueError("generate: padding_mask must be left padding (zeros before the tokens of each row)")
    if not padding_mask[:, -1].all():
        raise ValueError("generate: every prompt needs at least one real token (padding_mask row of zeros)")
    positions = np.cumsum(padding_mask, -1) - 1
    return np.where(padding_mask == 0, 1, positions)  # HF's placeholder position for padding


def generate(model: CausalLM, prompt_ids, max_new_tokens: int, do_sample: bool = False, temperature: float = 1.0,
             top_k: int = 0, top_p: float = 1.0, eos_token_id: int | Sequence[int] | None = None,
             seed: int | None = None, *, padding_mask=None, pad_token_id: int | None = None,
             use_cache: bool | None = None) -> np.ndarray:
    """Prompt + up to `max_new_tokens` new tokens, int64 [B, P + n] (1-D in, 1-D out).

    eos_token_id / pad_token_id / use_cache default to the model's config (eos_token_id,
    pad_token_id, use_cache); without a pad id, finished rows are padded with the first EOS id.
    `use_cache=False` recomputes the whole sequence every step (reference for the cached path).
    """
    ids = np.asarray(prompt_ids, dtype=np.int64)
    squeeze = ids.ndim == 1
    ids = ids[None] if squeeze else ids
    if ids.ndim != 2 or ids.shape[1] == 0:
        raise ValueError(f"generate: prompt_ids must be [B, P] with P >= 1, got shape {ids.shape}")
    if ids.min() < 0 or ids.max() >= model.args.vocab_size:
        raise ValueError(f"generate: prompt ids must lie in [0, {model.args.vocab_size})")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"generate: max_new_tokens must be a non-negative int, got {max_new_tokens!r}")
    if do_sample and not temperature > 0:
        raise ValueError(f"generate: temperature must be > 0 when sampling, got {temperature}")
    if not 0 < top_p <= 1 or top_k < 0:
        raise ValueError(f"generate: need 0 < top_p <= 1 and top_k >= 0, got top_p={top_p}, top_k={top_k}")
    if eos_token_id is None:
        eos = model.args.eos_token_ids
    else:
        eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    if pad_token_id is None:
        pad_token_id = model.args.pad_token_id if model.args.pad_token_id is not None else (eos[0] if eos else 0)
    use_cache = model.args.use_cache if use_cache is None else use_cache
    if max_new_tokens == 0:
        return ids[0] if squeeze else ids

    batch, prompt_len = ids.shape
    total = prompt_len + max_new_tokens
    tokens = np.zeros((batch, total), np.int64)
    tokens[:, :prompt_len] = ids
    if padding_mask is None:
        prompt_positions = np.broadcast_to(np.arange(prompt_len), (batch, prompt_len))
        mask = None
    else:
        padding_mask = np.asarray(padding_mask).astype(np.int64)
        if padding_mask.shape != ids.shape:
            raise ValueError(f"generate: padding_mask shape {padding_mask.shape} != prompt shape {ids.shape}")
        prompt_positions = _left_padding_positions(padding_mask)
        key_padding = np.zeros((batch, total), bool)
        key_padding[:, :prompt_len] = padding_mask == 0
        mask = Tensor(key_padding[:, None, None, :])
    positions = np.concatenate(
        [prompt_positions, prompt_positions[:, -1:] + np.arange(1, max_new_tokens + 1)], 1).astype(np.int32)

    step = _step_for(model, use_cache, batch, total)
    rng = np.random.default_rng(seed)
    finished = np.zeros(batch, dtype=bool)
    length = prompt_len
    with synchronous_pynative():
        while length < total:
            if not use_cache:
                logits = step(Tensor(tokens, ms.int32), Tensor(positions), Tensor([length - 1], ms.int32), mask)
            elif length == prompt_len:
                logits = step(Tensor(tokens[:, :length], ms.int32), Tensor(positions[:, :length]), mask)
            else:
                logits = step(Tensor(tokens[:, length - 1:length], ms.int32), Tensor(positions[:, length - 1:length]), mask)
            last = logits.asnumpy()
            nxt = _sample(_warp(last, temperature, top_k, top_p), rng) if do_sample else last.argmax(-1)
            nxt = np.where(finished, pad_token_id, nxt)
            finished |= np.isin(nxt, eos)
            tokens[:, length] = nxt
            length += 1
            if eos and finished.all():
                break
    out = tokens[:, :length]
    return out[0] if squeeze else out
