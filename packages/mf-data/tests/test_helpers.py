"""The index builders (compiled and numpy, see the `helpers_backend` fixture) against
straight-line loops that follow Megatron's C++ step by step."""

from __future__ import annotations

import numpy as np
import pytest

from mf_data import helpers
from mf_data._reference import blending_indices_loop, build_sample_idx_loop, exhaustive_blending_indices_loop


def _random_sample_idx_case(rng):
    n = int(rng.integers(1, 80))
    sizes = rng.integers(0, 50, size=n).astype(np.int32)
    sizes[rng.integers(0, n)] = max(2, sizes.max())  # at least two tokens overall
    epochs = int(rng.integers(1, 4))
    docs = np.tile(np.arange(n, dtype=np.int32), epochs)
    rng.shuffle(docs)
    return sizes, docs, int(rng.integers(1, 60)), epochs, int(sizes.sum())


def test_sample_index_matches_the_walk(helpers_backend):
    rng = np.random.default_rng(1234)
    for _ in range(400):
        sizes, docs, seq, epochs, tokens = _random_sample_idx_case(rng)
        for drop_last in (True, False):
            for extra in (True, False):
                got = helpers.build_sample_idx(sizes, docs, seq, epochs, tokens, drop_last, extra)
                want = build_sample_idx_loop(sizes, docs, seq, epochs, tokens, drop_last, extra)
                assert got.dtype == want.dtype and np.array_equal(got, want), (seq, drop_last, extra)


def test_sample_index_chunk_boundaries(monkeypatch):
    """The numpy version processes the running token count in chunks; boundaries must not matter."""
    monkeypatch.setattr(helpers, "_compiled", None)
    rng = np.random.default_rng(7)
    sizes, docs, seq, epochs, tokens = _random_sample_idx_case(rng)
    want = build_sample_idx_loop(sizes, docs, seq, epochs, tokens)
    for chunk in (1, 2, 3, 7):
        monkeypatch.setattr(helpers, "_DOC_CHUNK", chunk)
        assert np.array_equal(helpers.build_sample_idx(sizes, docs, seq, epochs, tokens), want)


def test_sample_index_dtype_rule(helpers_backend):
    sizes = np.array([5, 7], dtype=np.int32)
    docs = np.array([0, 1], dtype=np.int32)
    assert helpers.build_sample_idx(sizes, docs, 3, 1, 12).dtype == np.int32
    assert helpers.sample_index_dtype(2, np.array([5, 2**31 - 1], dtype=np.int64)) == np.int32
    assert helpers.sample_index_dtype(2, np.array([5, 2**31], dtype=np.int64)) == np.int64
    assert helpers.sample_index_dtype(2**31, sizes) == np.int64


@pytest.mark.parametrize("size", [1, 37, 2047, 2048, 20000])
def test_blending_matches_the_greedy_loop(size, helpers_backend):
    """Both the plain loop (small) and the speculative path (>= 2048 samples) are exact."""
    rng = np.random.default_rng(size)
    for trial in range(12):
        n = int(rng.integers(1, 9))
        w = rng.random(n) ** 3 + 1e-4
        w = (w / w.sum()).tolist()
        got = helpers.build_blending_indices(w, size)
        want = blending_indices_loop(w, size)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), (trial, w)
        assert got[0].dtype == np.int16 and got[1].dtype == np.int64


def test_blending_extreme_and_tied_weights(helpers_backend):
    for w in ([0.5, 0.5], [1 / 3] * 3, [1e-6, 1 - 1e-6], [0.25] * 4, [0.1, 0.2, 0.3, 0.4], [1.0]):
        got = helpers.build_blending_indices(w, 9000)
        want = blending_indices_loop(w, 9000)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), w


def test_exhaustive_blending_matches_the_loop(helpers_backend):
    rng = np.random.default_rng(3)
    for _ in range(10):
        sizes = rng.integers(1, 3000, size=int(rng.integers(1, 6))).tolist()
        got = helpers.build_exhaustive_blending_indices(sizes)
        want = exhaustive_blending_indices_loop(sizes)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), sizes
        assert np.bincount(got[0], minlength=len(sizes)).tolist() == sizes


def test_shuffles_follow_megatron_random_state_order():
    docs = np.arange(10, 20, dtype=np.int32)
    rs = np.random.RandomState(5)
    doc_index = helpers.build_document_index(docs, 3, rs, separate_final_epoch=True)
    shuffle = helpers.build_shuffle_index(7, 12, rs)
    replay = np.random.RandomState(5)
    first = np.tile(docs, 2)
    replay.shuffle(first)
    last = docs.copy()
    replay.shuffle(last)
    head = np.arange(7, dtype=np.uint32)
    replay.shuffle(head)
    tail = np.arange(7, 12, dtype=np.uint32)
    replay.shuffle(tail)
    assert np.array_equal(doc_index, np.concatenate([first, last])) and doc_index.dtype == np.int32
    assert np.array_equal(shuffle, np.concatenate([head, tail])) and shuffle.dtype == np.uint32


def test_compiled_helpers_are_built():
    """The install builds mf_data._chelpers (a C compiler is part of this project's setup);
    without it mf_data still works, on the numpy versions, only slower."""
    assert helpers._compiled is not None and helpers.BACKEND == "compiled", (
        "mf_data._chelpers is missing: reinstall mf-data where a C compiler is available"
    )


def test_compiled_sample_index_with_wide_inputs_and_long_documents(helpers_backend):
    """int64 inputs, documents longer than several samples, zero-length documents, and the
    int64 sample index Megatron switches to when the document index outgrows int32."""
    rng = np.random.default_rng(11)
    sizes = rng.integers(0, 400, size=300).astype(np.int64)
    sizes[::17] = 0
    sizes[5] = 5000
    docs = np.tile(np.arange(sizes.size, dtype=np.int64), 2)
    rng.shuffle(docs)
    for seq in (1, 7, 64, 1000):
        for drop_last in (True, False):
            want = build_sample_idx_loop(sizes, docs, seq, 2, int(sizes.sum()), drop_last, True)
            got = helpers.build_sample_idx(sizes, docs, seq, 2, int(sizes.sum()), drop_last, True)
            assert got.dtype == want.dtype and np.array_equal(got, want), (seq, drop_last)


def test_compiled_sample_index_rejects_ids_outside_sizes():
    if helpers._compiled is None:
        pytest.skip("mf_data._chelpers was not built")
    out = np.empty((3, 2), np.int32)
    with pytest.raises(ValueError, match="outside sizes"):
        helpers._compiled.sample_idx(np.array([4, 4], np.int32), np.array([0, 2], np.int32), 2, 2, 1, out)
    with pytest.raises(ValueError, match="shape"):
        helpers._compiled.sample_idx(np.array([4, 4], np.int32), np.array([0, 1], np.int32), 2, 5, 1, out)


def test_blending_with_many_datasets(helpers_backend):
    """More than the 8 datasets the compiled greedy specialises for."""
    rng = np.random.default_rng(5)
    w = rng.random(23) + 0.01
    w = (w / w.sum()).tolist()
    got = helpers.build_blending_indices(w, 5000)
    want = blending_indices_loop(w, 5000)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_compiled_helpers_refuse_arrays_of_the_wrong_kind():
    """The extension reads raw buffers: a float array where integers belong is refused, not
    reinterpreted."""
    if helpers._compiled is None:
        pytest.skip("mf_data._chelpers was not built")
    sizes, docs = np.array([4, 4], np.int32), np.array([0, 1], np.int32)
    with pytest.raises(TypeError, match="out"):
        helpers._compiled.sample_idx(sizes, docs, 2, 2, 1, np.empty((3, 2), np.float32))
    with pytest.raises(TypeError, match="sizes"):
        helpers._compiled.sample_idx(sizes.astype(np.float32), docs, 2, 2, 1, np.empty((3, 2), np.int32))
    with pytest.raises(TypeError, match="weights"):
        helpers._compiled.blending(np.array([1, 1], np.int64), None, np.empty(4, np.int16), np.empty(4, np.int64))
    with pytest.raises(TypeError, match="dataset_sample_index"):
        helpers._compiled.blending(np.array([0.5, 0.5]), None, np.empty(4, np.int16), np.empty(4, np.float64))


def test_exhaustive_blending_where_datasets_fill_up_early_or_start_empty(helpers_backend):
    """The compiled exhaustive blend runs the uncapped greedy until the first dataset is full,
    then the capped one: small caps beside large ones, and a zero cap, must not change a pick."""
    for sizes in ([1, 5000, 3], [2, 2], [0, 40, 7], [3000, 1, 1, 1, 2999], [7, 0]):
        got = helpers.build_exhaustive_blending_indices(sizes)
        want = exhaustive_blending_indices_loop(sizes)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), sizes
