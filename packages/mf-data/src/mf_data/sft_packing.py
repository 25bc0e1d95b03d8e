"""Packing SFT samples into rows of `seq_length` tokens, and the columns of packed rows.

Packing is sequential (next-fit): samples are taken in their (shuffled) order and appended to
the current row while they fit; the first that does not fit starts the next row. Order is kept,
so the rows are a pure function of the order and the lengths, and each row needs one
`searchsorted` to find where it ends. A row also closes after `max_per_row` samples (room for the
boundaries in `actual_seq_len`). Samples longer than the row are truncated to their first
`seq_length` tokens before packing (the same policy as `preprocess-sft --seq-length`).

Columns of a row holding samples s_1..s_k (lengths n_1..n_k, total n <= S) then padding:

* `input_ids`: the samples' tokens back to back, 0 on padding;
* `labels[t]`: the next token of the same sample; 0 at each sample's last token and on padding;
* `loss_mask[t]`: the mask channel's value of token t + 1 when it is in the same sample (so the
  loss is on predicting response tokens), else 0 - samples never predict into each other;
* `position_ids`: 0..n_i-1 within each sample; the padding counts from 0 as a segment of its own;
* `attention_mask` [1, S, S] bool, True = masked (Megatron): causal and block-diagonal over
  those segments;
* `actual_seq_len` [eod_pad_length] int32: the exclusive end of each sample, then S when
  padding follows, repeated up to the length (the compressed EOD mask GPTDataset builds).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .samples import causal_mask


def pack_rows(lengths: np.ndarray, seq_length: int, max_per_row: int) -> np.ndarray:
    """Row boundaries `[0, e_1, ..., n]` (offsets into the sample order) for samples of `lengths`
    (each in 1..seq_length) packed sequentially."""
    n = int(lengths.size)
    ends = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=ends[1:])
    bounds = [0]
    start = 0
    while start < n:
        # The last sample that still fits: largest j with ends[j] - ends[start] <= seq_length.
        stop = int(np.searchsorted(ends, ends[start] + seq_length, side="right")) - 1
        stop = min(stop, start + max_per_row, n)
        bounds.append(stop)
        start = stop
    return np.asarray(bounds, dtype=np.int64)


def build_sft_columns(
    tokens: np.ndarray,
    mask: np.ndarray,
    ends: Sequence[Sequence[int]],
    *,
    create_attention_mask: bool,
    create_compressed_eod_mask: bool,
    eod_pad_length: int,
) -> dict[str, np.ndarray]:
    """Columns for rows `tokens` [B, S] (int64, 0 on padding) and `mask` [B, S] (bool), where
    `ends[b]` lists the exclusive end of every segment of row b (samples, then S)."""
    batch, seq = tokens.shape
    last = np.zeros((batch, seq), dtype=bool)  # t is the last token of its segment
    starts = np.zeros((batch, seq), dtype=np.int64)
    segment = np.zeros((batch, seq), dtype=np.int32) if create_attention_mask else None
    for b, row_ends in enumerate(ends):
        prev = 0
        for k, end in enumerate(row_ends):
            last[b, end - 1] = True
            starts[b, prev:end] = prev
            if segment is not None:
                segment[b, prev:end] = k
            prev = end
    follows = ~last[:, :-1]  # t + 1 belongs to the same segment as t
    labels = np.zeros((batch, seq), dtype=np.int64)
    labels[:, :-1] = np.where(follows, tokens[:, 1:], 0)
    loss_mask = np.zeros((batch, seq), dtype=np.float32)
    loss_mask[:, :-1] = follows & mask[:, 1:]
    out = {
        "input_ids": tokens,
        "labels": labels,
        "loss_mask": loss_mask,
        "position_ids": np.arange(seq, dtype=np.int64)[None, :] - starts,
    }
    if segment is not None:
        blocked = segment[:, :, None] != segment[:, None, :]
        blocked |= causal_mask(seq)
        out["attention_mask"] = blocked[:, None, :, :]
    if create_compressed_eod_mask:
        actual = np.full((batch, eod_pad_length), seq, dtype=np.int32)
        for b, row_ends in enumerate(ends):
            actual[b, : len(row_ends)] = row_ends
        out["actual_seq_len"] = actual
    return out
