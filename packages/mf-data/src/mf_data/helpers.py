"""The index-building hot loops: compiled C when available, else vectorised numpy.

Megatron-Core runs these as compiled C++ (`helpers.cpp`). mf_data has them twice, giving
bit-identical arrays: the small C extension `mf_data._chelpers` (built at install time when a C
compiler is present; faster than Megatron's loops, which it rearranges to avoid a mispredicted
branch per sample) and the numpy programs below (always there; used when the extension is
missing, or when the environment sets MF_DATA_HELPERS=numpy). `BACKEND` says which one runs.
The document and shuffle indices are numpy in both (their cost is numpy's RandomState shuffle,
which Megatron calls too). The numpy versions:

* `build_document_index` / `build_shuffle_index`: tiled document ids and `arange`s shuffled by one
  `numpy.random.RandomState`, called in Megatron's order (the caller owns the state).
* `build_sample_idx`: the C++ walk over documents, one sample at a time, is a search: sample i
  starts at global token i * seq_length, so its (document position, offset) pair is found with
  `searchsorted` over the running token count of the document index (done in chunks, so memory
  stays bounded for very long document indices).
* `build_blending_indices` / `build_exhaustive_blending_indices`: the greedy "largest sampling
  error first" rule is sequential, so it is computed speculatively: the sequence is cut into
  chunks, each chunk's starting counts are guessed by largest-remainder rounding, all chunks are
  stepped together as one vectorised greedy, and a sequential pass then fixes any chunk whose
  guess was wrong by re-running it from the true counts until it meets the speculative run
  (from equal counts at an equal step the greedy is deterministic, so the rest is already right).
  The arithmetic per step is the C++ one (`w * double(max(s, 1)) - double(count)`, first maximum
  wins), so the result is exact, not approximate.
"""

from __future__ import annotations

import math
import os

import numpy as np

try:
    from . import _chelpers as _compiled
except ImportError:  # installed without a C compiler: the numpy versions below serve
    _compiled = None
if os.environ.get("MF_DATA_HELPERS", "").strip().lower() == "numpy":
    _compiled = None

BACKEND = "numpy" if _compiled is None else "compiled"

_INT32_MAX = np.iinfo(np.int32).max
_DOC_CHUNK = 1 << 22  # documents per chunk of the running token count in build_sample_idx
_LOOP_BELOW = 2048  # below this many samples the plain greedy loop is cheaper than speculation


def build_document_index(
    documents: np.ndarray, num_epochs: int, random_state: np.random.RandomState, separate_final_epoch: bool
) -> np.ndarray:
    """`num_epochs` copies of `documents`, shuffled (the last epoch on its own if separated)."""
    if not separate_final_epoch or num_epochs == 1:
        document_index = np.tile(np.asarray(documents, dtype=np.int32), num_epochs)
        random_state.shuffle(document_index)
        return document_index
    first = build_document_index(documents, num_epochs - 1, random_state, False)
    last = build_document_index(documents, 1, random_state, False)
    return np.concatenate((first, last))


def build_shuffle_index(num_samples: int, total_size: int, random_state: np.random.RandomState) -> np.ndarray:
    """A shuffled `arange(num_samples)`, then (if larger) a separately shuffled rest up to total_size."""
    dtype = np.uint32 if total_size < np.iinfo(np.uint32).max - 1 else np.int64
    first = np.arange(0, num_samples, dtype=dtype)
    random_state.shuffle(first)
    if num_samples == total_size:
        return first
    last = np.arange(num_samples, total_size, dtype=dtype)
    random_state.shuffle(last)
    return np.concatenate((first, last))


def sample_count(
    num_epochs: int, tokens_per_epoch: int, sequence_length: int, drop_last_partial_sequence: bool, add_extra_token: bool
) -> int:
    """Number of samples the sample index describes (C++ integer and float32 arithmetic kept)."""
    total = num_epochs * tokens_per_epoch - int(add_extra_token)
    if drop_last_partial_sequence:
        # C++ int64 division truncates toward zero.
        return total // sequence_length if total >= 0 else -((-total) // sequence_length)
    return int(np.ceil(np.float32(total) / np.float32(sequence_length)))


def sample_index_dtype(num_documents_in_index: int, sizes: np.ndarray) -> type[np.integer]:
    """Megatron's rule: int32 when both the document count and the largest size fit it."""
    if num_documents_in_index > _INT32_MAX:
        return np.int64
    if np.issubdtype(sizes.dtype, np.integer) and np.iinfo(sizes.dtype).max <= _INT32_MAX:
        return np.int32  # no value can be larger: skip the scan (sizes are int32 in a .idx)
    largest = int(sizes.max()) if sizes.size else 0
    return np.int32 if largest <= _INT32_MAX else np.int64


def _as_int32(a: np.ndarray) -> np.ndarray | None:
    """`a` as a contiguous int32 array (no copy when it already is one), or None if it cannot be."""
    if a.dtype == np.int32:
        return np.ascontiguousarray(a)
    if not np.issubdtype(a.dtype, np.integer):
        return None
    if a.size and (int(a.min()) < 0 or int(a.max()) > _INT32_MAX):
        return None
    return np.ascontiguousarray(a, dtype=np.int32)


def build_sample_idx(
    sizes: np.ndarray,
    document_indices: np.ndarray,
    sequence_length: int,
    num_epochs: int,
    tokens_per_epoch: int,
    drop_last_partial_sequence: bool = True,
    add_extra_token_to_sequence: bool = True,
) -> np.ndarray:
    """[num_samples + 1, 2] array of (position in document_indices, token offset) where samples start."""
    extra = int(bool(add_extra_token_to_sequence))
    seq = int(sequence_length)
    num_samples = sample_count(num_epochs, tokens_per_epoch, seq, drop_last_partial_sequence, extra)
    n_docs = int(document_indices.shape[0])
    dtype = sample_index_dtype(n_docs, sizes)
    if num_samples <= 0:
        return np.zeros((max(num_samples, -1) + 1, 2), dtype=dtype)
    if _compiled is not None and n_docs > 0:
        sizes32, docs32 = _as_int32(np.asarray(sizes)), _as_int32(np.asarray(document_indices))
        if sizes32 is not None and docs32 is not None:
            out = np.empty((num_samples + 1, 2), dtype=dtype)
            _compiled.sample_idx(sizes32, docs32, seq, num_samples, extra, out)
            return out
    out = np.zeros((num_samples + 1, 2), dtype=dtype)
    starts = np.arange(1, num_samples + 1, dtype=np.int64) * seq
    targets = starts + extra  # sample i needs tokens up to and including global position starts[i]
    done = 0
    carry = 0  # tokens in the documents before the current chunk
    for c0 in range(0, n_docs, _DOC_CHUNK):
        if done == num_samples:
            break
        lengths = sizes[document_indices[c0 : c0 + _DOC_CHUNK]].astype(np.int64)
        ends = np.cumsum(lengths)
        ends += carry
        hi = int(np.searchsorted(targets, ends[-1], side="right"))
        if hi > done:
            k = np.searchsorted(ends, targets[done:hi], side="left")
            out[1 + done : 1 + hi, 0] = c0 + k
            out[1 + done : 1 + hi, 1] = starts[done:hi] - (ends[k] - lengths[k])
            done = hi
        carry = int(ends[-1])
    if done < num_samples:
        # Only a kept partial last sample can run past the last document (as in the C++ walk).
        last = int(sizes[document_indices[-1]])
        out[1 + done :, 0] = n_docs - 1
        out[1 + done :, 1] = last - extra
    return out


# --- blending ---------------------------------------------------------------------------------


def build_blending_indices(weights: list[float] | np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(dataset_index int16, dataset_sample_index int64) of `size` samples drawn per `weights`."""
    w = np.ascontiguousarray(weights, dtype=np.float64)
    if _compiled is not None and size > 0:
        return _compiled_greedy(w, int(size), None)
    picks = _greedy_picks(w, int(size), None)
    return picks, _per_dataset_counter(picks, w.size)


def build_exhaustive_blending_indices(sizes: list[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Blend that draws exactly `sizes[i]` samples from dataset i, in proportion to the sizes."""
    caps = np.asarray(sizes, dtype=np.int64)
    total = int(caps.sum())
    w = caps / np.float64(total) if total else caps.astype(np.float64)
    if _compiled is not None and total > 0:
        return _compiled_greedy(w, total, np.ascontiguousarray(caps))
    picks = _greedy_picks(w, total, caps)
    return picks, _per_dataset_counter(picks, caps.size)


def _compiled_greedy(w: np.ndarray, size: int, caps: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    picks = np.empty(size, dtype=np.int16)
    counter = np.empty(size, dtype=np.int64)
    _compiled.blending(w, caps, picks, counter)
    return picks, counter


def _per_dataset_counter(picks: np.ndarray, num_datasets: int) -> np.ndarray:
    """For each pick, how many earlier picks chose the same dataset."""
    if num_datasets <= 16:  # a few masked passes beat a sort here
        counter = np.empty(picks.size, dtype=np.int64)
        for d in range(num_datasets):
            mask = picks == d
            counter[mask] = np.arange(int(np.count_nonzero(mask)), dtype=np.int64)
        return counter
    order = np.argsort(picks, kind="stable")
    group_start = np.zeros(num_datasets + 1, dtype=np.int64)
    np.cumsum(np.bincount(picks, minlength=num_datasets), out=group_start[1:])
    counter = np.empty(picks.size, dtype=np.int64)
    counter[order] = np.arange(picks.size, dtype=np.int64) - group_start[picks[order]]
    return counter


def _greedy_step(w: list[float], counts: list[int], s: int, caps: list[int] | None) -> int:
    """One step of Megatron's greedy: the first dataset with the largest w*s - count."""
    sd = float(max(s, 1))
    best, best_err = -1, -math.inf
    for d, wd in enumerate(w):
        if caps is not None and counts[d] >= caps[d]:
            continue
        err = wd * sd - counts[d]
        if best < 0 or err > best_err:
            best, best_err = d, err
    return best


def _greedy_picks(w: np.ndarray, size: int, caps: np.ndarray | None) -> np.ndarray:
    if size <= 0:
        return np.zeros(0, dtype=np.int16)
    if size < _LOOP_BELOW:
        return _greedy_loop(w.tolist(), size, None if caps is None else caps.tolist(), [0] * w.size, 0)
    return _greedy_speculative(w, size, caps)


def _greedy_loop(w: list[float], size: int, caps: list[int] | None, counts: list[int], s0: int) -> np.ndarray:
    out = np.empty(size, dtype=np.int16)
    for t in range(size):
        d = _greedy_step(w, counts, s0 + t, caps)
        out[t] = d
        counts[d] += 1
    return out


def _guess_counts(w: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Largest-remainder rounding of w * s to integers summing to s, per row of `steps`."""
    quota = w[None, :] * steps[:, None].astype(np.float64)
    counts = np.floor(quota).astype(np.int64)
    short = steps - counts.sum(axis=1)
    order = np.argsort(-(quota - counts), axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(w.size), order.shape), axis=1)
    counts += rank < short[:, None]
    return counts


def _greedy_speculative(w: np.ndarray, size: int, caps: np.ndarray | None) -> np.ndarray:
    n_sets = w.size
    chunk = max(64, int(2 * math.sqrt(size)))
    n_chunks = -(-size // chunk)
    starts = np.arange(n_chunks, dtype=np.int64) * chunk
    guess = _guess_counts(w, starts)
    guess[0] = 0
    counts = guess.astype(np.float64)  # exact: counts stay far below 2**53
    caps_f = None if caps is None else caps.astype(np.float64)[None, :]
    picks = np.empty((n_chunks, chunk), dtype=np.int16)
    rows = np.arange(n_chunks)
    for t in range(chunk):
        s = np.maximum(starts + t, 1).astype(np.float64)
        err = w[None, :] * s[:, None] - counts
        if caps_f is not None:
            err[counts >= caps_f] = -np.inf
        choice = err.argmax(axis=1)
        picks[:, t] = choice
        counts[rows, choice] += 1.0
    ends = counts.astype(np.int64)

    # Sequential pass: chunk k is right iff it started from the true counts; else repair it.
    w_list = w.tolist()
    caps_list = None if caps is None else caps.tolist()
    true = np.zeros(n_sets, dtype=np.int64)
    for k in range(n_chunks):
        if np.array_equal(guess[k], true):
            true = ends[k]
            continue
        spec = guess[k].tolist()
        real = true.tolist()
        row = picks[k]
        spec_row = row.tolist()
        s0 = int(starts[k])
        length = min(chunk, size - s0)
        merged = False
        for t in range(length):
            if real == spec:
                merged = True
                break
            d = _greedy_step(w_list, real, s0 + t, caps_list)
            row[t] = d
            real[d] += 1
            spec[spec_row[t]] += 1
        true = ends[k] if merged else np.asarray(real, dtype=np.int64)
    return picks.reshape(-1)[:size].copy()
