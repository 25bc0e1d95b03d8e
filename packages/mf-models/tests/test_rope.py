"""RoPE kinds against plain-Python references transcribed from transformers' formulas, and the
rotation against the complex-number form of RoPE."""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
import pytest

from mf_models.common.rope import RotaryEmbedding, apply_rotary, normalize_rope, rope_frequencies, softmax_mscale

DIM = 16


def ref_default(theta, dim=DIM):
    return [1.0 / theta ** (i / dim) for i in range(0, dim, 2)]


def ref_llama3(theta, factor, low, high, old_len, dim=DIM):
    out = []
    for f in ref_default(theta, dim):
        wavelen = 2 * math.pi / f
        if wavelen < old_len / high:
            out.append(f)
        elif wavelen > old_len / low:
            out.append(f / factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return out


def ref_yarn(theta, factor, original, beta_fast=32, beta_slow=1, dim=DIM):
    def corr(rot):
        return dim * math.log(original / (rot * 2 * math.pi)) / (2 * math.log(theta))

    low, high = max(math.floor(corr(beta_fast)), 0), min(math.ceil(corr(beta_slow)), dim - 1)
    out = []
    for i, f in enumerate(ref_default(theta, dim)):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        extrapolate = 1 - ramp  # weight of the unscaled frequency
        out.append(f / factor * (1 - extrapolate) + f * extrapolate)
    return out


def freqs(rope, max_pos=64):
    rope = normalize_rope(rope, None, None)
    return rope_frequencies(rope, DIM, max_pos)


def test_default():
    inv, scale = freqs({"rope_type": "default", "rope_theta": 10000.0})
    np.testing.assert_allclose(inv, ref_default(10000.0), rtol=1e-6)
    assert scale == 1.0


def test_linear():
    inv, scale = freqs({"rope_type": "linear", "rope_theta": 500.0, "factor": 4.0})
    np.testing.assert_allclose(inv, [f / 4.0 for f in ref_default(500.0)], rtol=1e-6)
    assert scale == 1.0


def test_llama3_has_all_three_bands():
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    inv, scale = freqs(rope)
    expected = ref_llama3(500000.0, 8.0, 1.0, 4.0, 64)
    np.testing.assert_allclose(inv, expected, rtol=1e-6)
    base = ref_default(500000.0)
    kept = sum(a == pytest.approx(b) for a, b in zip(expected, base))
    divided = sum(a == pytest.approx(b / 8) for a, b in zip(expected, base))
    assert kept and divided and kept + divided < len(base)  # some frequencies are smoothed
    assert scale == 1.0


def test_yarn_frequencies_and_attention_factor():
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32}
    inv, scale = freqs(rope, max_pos=128)
    np.testing.assert_allclose(inv, ref_yarn(10000.0, 4.0, 32), rtol=1e-6)
    assert scale == pytest.approx(0.1 * math.log(4.0) + 1.0)
    # without original_max_position_embeddings HF falls back to max_position_embeddings
    inv, _ = freqs({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}, max_pos=128)
    np.testing.assert_allclose(inv, ref_yarn(10000.0, 4.0, 128), rtol=1e-6)


def test_yarn_deepseek_mscale():
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}
    norm = normalize_rope(rope, None, None)
    _, scale = rope_frequencies(norm, DIM, 163840)
    assert scale == pytest.approx(1.0)  # mscale / mscale_all_dim cancel
    m = 0.1 * 1.0 * math.log(40.0) + 1.0
    assert softmax_mscale(norm) == pytest.approx(m * m)
    assert softmax_mscale(normalize_rope({"rope_type": "default"}, None, None)) == 1.0


def test_rotation_is_complex_multiplication():
    inv, _ = freqs({"rope_type": "default", "rope_theta": 100.0})
    rope = RotaryEmbedding(inv)
    positions = np.array([[0, 1, 5, 2, 0, 1]], np.int32)  # restarting positions (packed documents)
    cos, sin = rope(ms.Tensor(positions))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 6, DIM)).astype(np.float32)  # [B, heads, S, d]
    out = apply_rotary(ms.Tensor(x), cos, sin).asnumpy()
    # rotate_half layout: dimension i pairs with i + d/2, rotated by angle position * inv_freq[i]
    z = x[..., : DIM // 2] + 1j * x[..., DIM // 2:]
    rotated = z * np.exp(1j * positions[0][:, None] * inv[None, :].astype(np.float64))
    np.testing.assert_allclose(out, np.concatenate([rotated.real, rotated.imag], -1), atol=1e-5)
