"""Parity with Hugging Face transformers: every `<name>_ref.npz` in shared/fixtures/hf (logits and
greedy generations written by transformers 5.24 for the checkpoint in `<name>/`)."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest

import mf_models


@pytest.fixture(scope="module")
def case(hf_fixtures, hf_name):
    ref_path = hf_fixtures / f"{hf_name}_ref.npz"
    if not ref_path.is_file():
        pytest.fail(f"missing HF fixture {ref_path}")
    model = mf_models.load_hf(hf_fixtures / hf_name)
    return model, dict(np.load(ref_path))


def test_logits_match_hf(case):
    model, ref = case
    logits = model(ms.Tensor(ref["input_ids"], ms.int32)).asnumpy()
    assert logits.dtype == np.float32 and logits.shape == ref["logits"].shape
    assert np.abs(logits - ref["logits"]).max() < 1e-4


def test_greedy_generation_matches_hf(case):
    model, ref = case
    out = mf_models.generate(model, ref["prompt"], max_new_tokens=ref["greedy"].shape[1] - ref["prompt"].shape[1])
    np.testing.assert_array_equal(out, ref["greedy"])


def test_generation_without_cache_is_identical(case):
    model, ref = case
    new = ref["greedy"].shape[1] - ref["prompt"].shape[1]
    out = mf_models.generate(model, ref["prompt"], max_new_tokens=new, use_cache=False)
    np.testing.assert_array_equal(out, ref["greedy"])
