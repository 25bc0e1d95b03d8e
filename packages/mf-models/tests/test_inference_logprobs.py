"""Log-probabilities from the engine (logprobs.py) against a teacher-forced forward of the whole
sequence (no cache): the prompt's scores, the generated tokens' (greedy, and sampled after
temperature), the top alternatives in order, beside a request that asks for none."""

from __future__ import annotations

import numpy as np
import pytest
from mindspore import Tensor

import mf_models
from mf_models.inference import InferenceEngine, SamplingParams


@pytest.fixture(scope="module")
def tiny():
    return mf_models.build_model(mf_models.tiny_model_section("llama", vocab_size=100, eos_token_id=2), seed=4)


def teacher_forced(model, ids: list[int], temperature: float = 1.0) -> np.ndarray:
    """log_softmax(logits / temperature) [len(ids), V] of one forward over `ids` (float64)."""
    logits = model(Tensor(np.array([ids], np.int32))).asnumpy()[0].astype(np.float64) / temperature
    return logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - \
        logits.max(-1, keepdims=True)


def test_prompt_and_generated_logprobs_equal_a_teacher_forced_forward(tiny):
    engine = InferenceEngine(tiny, max_slots=3, max_len=48, eos_token_ids=[])
    prompt, other = [5, 9, 33, 7, 41, 12, 60], [11, 12]
    scored = SamplingParams(max_new_tokens=5, logprobs=3, prompt_logprobs=4)
    sampled = SamplingParams(max_new_tokens=6, do_sample=True, temperature=0.7, top_k=20, seed=3, logprobs=0)
    plain = SamplingParams(max_new_tokens=5)
    a, b, c = engine.generate([prompt, other, prompt], [scored, sampled, plain])
    assert c.output_ids == a.output_ids and c.output_logprobs == [] and c.prompt_logprobs is None
    ref = teacher_forced(tiny, prompt + a.output_ids)
    assert a.prompt_logprobs[0] is None and len(a.prompt_logprobs) == len(prompt)
    for i, entry in enumerate(a.prompt_logprobs[1:], 1):
        assert entry.token == prompt[i]
        assert entry.logprob == pytest.approx(ref[i - 1, prompt[i]], abs=1e-6)
        assert [t for t, _ in entry.top] == np.argsort(-ref[i - 1])[:4].tolist()
        assert [p for _, p in entry.top] == pytest.approx(np.sort(ref[i - 1])[::-1][:4], abs=1e-5)
    assert [e.token for e in a.output_logprobs] == a.output_ids
    for k, entry in enumerate(a.output_logprobs):
        row = ref[len(prompt) - 1 + k]
        assert entry.logprob == pytest.approx(row.max(), abs=1e-5) and entry.top[0] == (entry.token, entry.logprob)
        assert len(entry.top) == 3
    # sampled at temperature 0.7: the distribution it was drawn from, top-k not applied
    ref = teacher_forced(tiny, other + b.output_ids, 0.7)
    assert [e.token for e in b.output_logprobs] == b.output_ids and all(e.top == () for e in b.output_logprobs)
    for k, entry in enumerate(b.output_logprobs):
        assert entry.logprob == pytest.approx(ref[len(other) - 1 + k, entry.token], abs=1e-5)


def test_logprob_settings_are_checked():
    for value in (-1, 21, True, 2.0):
        with pytest.raises(ValueError, match="logprobs: must be null or an integer in 0..20"):
            SamplingParams(logprobs=value)


def test_batched_scorer_equals_the_teacher_forced_forward(tiny):
    from mf_models.inference import Scorer

    sequences = [[5, 9, 33, 7, 41, 12, 60], [11, 12], list(range(3, 40)), [7, 7, 7]]
    conts = [3, 1, 20, 2]
    scored = Scorer(tiny, batch_size=3, max_len=48).score(list(zip(sequences, conts)))
    for tokens, n, result in zip(sequences, conts, scored):
        ref = teacher_forced(tiny, tokens)
        expected = [ref[i - 1, tokens[i]] for i in range(len(tokens) - n, len(tokens))]
        assert result.logprobs == pytest.approx(expected, abs=1e-5)
        assert result.greedy == all(ref[i - 1].argmax() == tokens[i] for i in range(len(tokens) - n, len(tokens)))
    with pytest.raises(ValueError, match="cannot be scored"):
        Scorer(tiny).score([([5, 6], 2)])
