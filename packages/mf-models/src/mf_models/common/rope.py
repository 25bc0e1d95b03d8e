"""Rotary position embedding: HF `rope_parameters` / legacy `rope_scaling` kinds, and the rotation.

Frequencies follow transformers' `modeling_rope_utils` (v5) formulas, computed once in numpy:
- default: inv_freq[i] = theta ** (-2i / dim)
- linear:  inv_freq / factor
- llama3:  low frequencies (wavelength > original_max / low_freq_factor) divided by factor, high
           ones kept, the band between interpolated smoothly (Llama 3.1)
- yarn:    per-dimension blend of interpolated (1/factor) and extrapolated frequencies over the
           correction range [beta_fast, beta_slow] rotations, and cos/sin scaled by the attention
           factor (0.1 ln(factor) + 1, or mscale/mscale_all_dim ratio as DeepSeek sets it)
`dynamic` and `longrope` are rejected: both change frequencies with the running sequence length
(stateful across calls in HF), which a compiled static-shape training step cannot follow.
Rotation uses HF's rotate_half convention (no q/k permutation on conversion).
"""

from __future__ import annotations

import math
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Tensor, mint, nn, ops

from .rope_settings import normalize_rope  # noqa: F401  (re-exported: rope.py's API)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_frequencies(rope: dict[str, Any], dim: int, max_position_embeddings: int) -> tuple[np.ndarray, float]:
    """(inv_freq [dim/2] float32, attention scaling of cos/sin) for a normalized rope dict."""
    base = rope["rope_theta"]
    inv_freq = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    kind = rope["rope_type"]
    scaling = 1.0
    if kind == "linear":
        inv_freq = inv_freq / float(rope["factor"])
    elif kind == "llama3":
        factor = float(rope["factor"])
        low, high = float(rope["low_freq_factor"]), float(rope["high_freq_factor"])
        old_len = float(rope.get("original_max_position_embeddings") or max_position_embeddings)
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
        inv_freq = np.where(medium, smoothed, scaled)
    elif kind == "yarn":
        original = rope.get("original_max_position_embeddings") or max_position_embeddings
        factor = rope.get("factor")
        factor = float(factor) if factor is not None else max_position_embeddings / original
        scaling = rope.get("attention_factor")
        if scaling is None:
            mscale, mscale_all = rope.get("mscale"), rope.get("mscale_all_dim")
            if mscale and mscale_all:
                scaling = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
            else:
                scaling = _yarn_mscale(factor)
        beta_fast = rope.get("beta_fast") or 32
        beta_slow = rope.get("beta_slow") or 1

        def correction_dim(rotations: float) -> float:
            return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low, high = correction_dim(beta_fast), correction_dim(beta_slow)
        if rope.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # as HF: avoid a zero-width ramp
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extrapolation = 1 - ramp
        inv_freq = (inv_freq / factor) * (1 - extrapolation) + inv_freq * extrapolation
    return inv_freq.astype(np.float32), float(scaling)


def softmax_mscale(rope: dict[str, Any]) -> float:
    """DeepSeek's extra softmax-scale factor mscale^2 for scaled rope with `mscale_all_dim` (1.0 otherwise)."""
    if rope["rope_type"] == "default" or not rope.get("mscale_all_dim"):
        return 1.0
    m = _yarn_mscale(float(rope["factor"]), float(rope["mscale_all_dim"]))
    return m * m


class RotaryEmbedding(nn.Cell):
    """cos/sin [B, S, dim] (float32) for integer positions [B, S]; positions may restart (packing)."""

    def __init__(self, inv_freq: np.ndarray, attention_scaling: float = 1.0):
        super().__init__()
        self.inv_freq = Tensor(inv_freq, ms.float32)
        self.attention_scaling = attention_scaling

    def construct(self, position_ids):
        freqs = ops.expand_dims(position_ids.astype(ms.float32), -1) * self.inv_freq
        emb = mint.cat((freqs, freqs), -1)
        cos = ops.cos(emb)
        sin = ops.sin(emb)
        if self.attention_scaling != 1.0:
            cos = cos * self.attention_scaling
            sin = sin * self.attention_scaling
        return cos, sin


def rotate_half(x):
    half = x.shape[-1] // 2
    return mint.cat((-x[..., half:], x[..., :half]), -1)


def apply_rotary(x, cos, sin):
    """x [B, heads, S, d] rotated by cos/sin [B, S, d] (HF rotate_half layout). cos/sin are
    broadcast over the heads explicitly (see layers._broadcast_to: the memory of MindSpore's CPU
    broadcasting kernels)."""
    cos = ops.broadcast_to(ops.expand_dims(cos, 1).astype(x.dtype), x.shape)
    sin = ops.broadcast_to(ops.expand_dims(sin, 1).astype(x.dtype), x.shape)
    return x * cos + rotate_half(x) * sin


def deinterleave(x):
    """[.., d] pairs (x0,x1),(x2,x3).. -> (x0,x2,..,x1,x3,..): DeepSeek's `rope_interleave` weights."""
    shape = x.shape
    pairs = x.reshape(shape[:-1] + (shape[-1] // 2, 2))
    rank = len(shape) + 1
    return ops.transpose(pairs, tuple(range(rank - 2)) + (rank - 1, rank - 2)).reshape(shape)


def apply_partial_rotary(x, cos, sin, rotary_dim: int, interleaved: bool = False):
    """x [B, heads, S, d] with its first `rotary_dim` features rotated by cos/sin [B, S, rotary_dim]
    and the rest passed through (GLM-4's partial rotary). `interleaved`: the rotated features pair
    up as (x0, x1), (x2, x3), ... (GLM-4's `rotate_half` of even/odd features); they are
    de-interleaved first, the same permutation for queries and keys, which leaves every q.k dot
    product as the interleaved rotation gives it."""
    d = x.shape[-1]
    if rotary_dim == d:
        rot, rest = x, None
    else:
        rot, rest = ops.split(x, [rotary_dim, d - rotary_dim], -1)
    if interleaved:
        rot = deinterleave(rot)
    rot = apply_rotary(rot, cos, sin)
    return rot if rest is None else mint.cat((rot, rest), -1)
