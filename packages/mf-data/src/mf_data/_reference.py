"""Straight-line versions of the index loops: one Python step per sample, as Megatron's C++ runs.

They exist as a readable statement of the algorithms and as the baseline that `helpers` (the
vectorised versions the package uses) is tested and benchmarked against. Not used at run time.
"""

from __future__ import annotations

import numpy as np

from .helpers import sample_count, sample_index_dtype


def build_sample_idx_loop(
    sizes: np.ndarray,
    document_indices: np.ndarray,
    sequence_length: int,
    num_epochs: int,
    tokens_per_epoch: int,
    drop_last_partial_sequence: bool = True,
    add_extra_token_to_sequence: bool = True,
) -> np.ndarray:
    extra = int(bool(add_extra_token_to_sequence))
    num_samples = sample_count(num_epochs, tokens_per_epoch, sequence_length, drop_last_partial_sequence, extra)
    out = np.zeros((max(num_samples, -1) + 1, 2), dtype=sample_index_dtype(len(document_indices), sizes))
    sizes_list = sizes.tolist()
    docs = document_indices.tolist()
    last = len(docs) - 1
    position, offset = 0, 0
    for i in range(1, num_samples + 1):
        remaining = sequence_length + extra
        while remaining != 0:
            length = sizes_list[docs[position]] - offset
            remaining -= length
            if remaining <= 0:
                # The sample ends inside this document; the next one starts seq tokens later.
                offset += remaining + length - extra
                remaining = 0
            else:
                if position == last:
                    offset = sizes_list[docs[position]] - extra
                    break
                position += 1
                offset = 0
        out[i, 0] = position
        out[i, 1] = offset
    return out


def blending_indices_loop(weights: list[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    counts = [0] * len(weights)
    dataset_index = np.zeros(size, dtype=np.int16)
    dataset_sample_index = np.zeros(size, dtype=np.int64)
    for s in range(size):
        sd = float(max(s, 1))
        best, best_err = 0, weights[0] * sd - counts[0]
        for d in range(1, len(weights)):
            err = weights[d] * sd - counts[d]
            if err > best_err:
                best, best_err = d, err
        dataset_index[s] = best
        dataset_sample_index[s] = counts[best]
        counts[best] += 1
    return dataset_index, dataset_sample_index


def exhaustive_blending_indices_loop(sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    total = sum(sizes)
    weights = [s / float(total) for s in sizes]
    counts = [0] * len(sizes)
    unspent = [d for d in range(len(sizes)) if sizes[d] > 0]
    dataset_index = np.zeros(total, dtype=np.int16)
    dataset_sample_index = np.zeros(total, dtype=np.int64)
    s = 0
    while unspent:
        sd = float(max(s, 1))
        best, best_err = -1, -float("inf")
        for d in unspent:
            err = weights[d] * sd - counts[d]
            if best < 0 or err > best_err:
                best, best_err = d, err
        dataset_index[s] = best
        dataset_sample_index[s] = counts[best]
        counts[best] += 1
        if counts[best] == sizes[best]:
            unspent.remove(best)
        s += 1
    return dataset_index, dataset_sample_index
