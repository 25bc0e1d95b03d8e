"""The on-device token chooser against HF's warpers (numpy, generation.py's transcription), and
the text layer: stop strings across token boundaries, held-back partial characters."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest

from mf_models.generation import _warp
from mf_models.inference import TextStream, TokenChooser

V = 40


def numpy_choice(logits, temperature, top_k, top_p, u):
    """HF's temperature -> top-k -> top-p, then the inverse CDF over tokens by falling probability."""
    warped = _warp(logits[None].astype(np.float64), temperature, top_k, top_p)[0]
    probs = np.exp(warped - warped.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    cdf = np.cumsum(probs[order])
    return int(order[min(np.searchsorted(cdf, u * cdf[-1], side="right"), V - 1)])


def choose(chooser, logits, temperature, top_k, top_p, u, greedy):
    args = [ms.Tensor(np.asarray(a, dt)) for a, dt in ((logits, np.float32), (temperature, np.float32),
                                                        (top_k, np.int32), (top_p, np.float32), (u, np.float32),
                                                        (greedy, bool))]
    return chooser(*args).asnumpy()


def test_sampled_tokens_equal_hf_warpers_with_the_same_draw():
    rng = np.random.default_rng(0)
    rows = 64
    logits = rng.normal(0, 2, (rows, V)).astype(np.float32)
    temperature = rng.choice([0.5, 1.0, 1.7], rows).astype(np.float32)
    top_k = rng.choice([0, 1, 5, 17], rows).astype(np.int32)
    top_p = rng.choice([1.0, 0.9, 0.5, 0.05], rows).astype(np.float32)
    u = rng.random(rows).astype(np.float32)
    greedy = rng.random(rows) < 0.25
    got = choose(TokenChooser(V, sample=True), logits, temperature, top_k, top_p, u, greedy)
    for r in range(rows):
        expected = int(logits[r].argmax()) if greedy[r] else numpy_choice(logits[r], temperature[r], top_k[r], top_p[r], u[r])
        assert got[r] == expected, (r, temperature[r], top_k[r], top_p[r])
    assert len(set(got[~greedy].tolist())) > 5  # the rows really sampled
    np.testing.assert_array_equal(choose(TokenChooser(V, sample=False), logits, temperature, top_k, top_p, u, greedy),
                                  logits.argmax(-1))


def test_draw_frequencies_follow_the_warped_distribution():
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 1.5, V).astype(np.float32)
    rows = 4000
    u = (np.arange(rows) + 0.5) / rows  # an even grid over [0, 1): frequencies are the probabilities
    got = choose(TokenChooser(V, sample=True), np.tile(logits, (rows, 1)), np.full(rows, 0.8), np.full(rows, 12),
                 np.full(rows, 0.8), u, np.zeros(rows, bool))
    warped = _warp(logits[None].astype(np.float64), 0.8, 12, 0.8)[0]
    probs = np.exp(warped - warped.max())
    probs /= probs.sum()
    freq = np.bincount(got, minlength=V) / rows
    np.testing.assert_allclose(freq, probs, atol=2.0 / rows)
    assert (freq[probs == 0] == 0).all()


def chars(ids):
    return "".join(chr(i) for i in ids)


def test_stop_string_across_tokens_is_cut_and_never_released():
    stream = TextStream(chars, ["END"])
    out = [stream.push([ord(c) for c in piece]) for piece in ("ab", "cE", "N", "Dxyz")]
    assert out == ["ab", "c", "", ""] and stream.stopped and stream.text == "abc" and stream.stop_string == "END"
    assert stream.finish() == "" and stream.push([ord("q")]) == ""
    held = TextStream(chars, ["END"])
    assert held.push([ord("E")]) == "" and held.push([ord("x")]) == "Ex" and not held.stopped
    assert held.push([ord("E"), ord("N")]) == "" and held.finish() == "EN" and held.text == "ExEN"


def test_earliest_of_several_stop_strings_wins_and_partial_characters_wait():
    stream = TextStream(chars, ["zz", "b"])
    assert stream.push([ord(c) for c in "azzb"]) == "a" and stream.stop_string == "zz"

    def utf8(ids):
        return bytes(ids).decode("utf-8", errors="replace")

    text = TextStream(utf8)
    e_acute = list("é".encode())
    assert text.push([ord("a"), e_acute[0]]) == "a" and text.push([e_acute[1]]) == "é"


def test_prompt_context_keeps_the_leading_space_sentencepiece_drops():
    pieces = {1: "▁Hello", 2: "▁world", 3: "!"}

    def spm_like(ids):  # sentencepiece drops the space of a decode's first word
        return "".join(pieces[i] for i in ids).replace("▁", " ").lstrip(" ")

    assert TextStream(spm_like, prompt_ids=[1]).push([2, 3]) == " world!"
    assert TextStream(spm_like).push([2, 3]) == "world!"


@pytest.mark.parametrize("context", [0, -1])
def test_text_stream_without_context(context):
    stream = TextStream(chars, (), prompt_ids=[ord("x")], context=context)
    assert stream.push([ord("y")]) == "y"
