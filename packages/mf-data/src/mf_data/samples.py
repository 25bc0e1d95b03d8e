"""Turning token windows into training columns, for a whole batch at once.

Given `text`, a [B, S + 1] window of token ids per sample (any integer dtype) (S + 0 when
`add_extra_token_to_sequence` is off), this builds Megatron's columns, vectorised over the batch:

* `input_ids`  [B, S] int64 - Megatron's `tokens`: text[:, :-1] (pad ids replaced by 0);
* `labels`     [B, S] int64 - text[:, 1:] (pad ids replaced by 0); without the extra token the
  window shifted left by one with the last label set to pad;
* `loss_mask`  [B, S] float32 - 1, 0 where the label is pad, and with `eod_mask_loss` 0 where
  the *input* token is eod;
* `position_ids` [B, S] int64 - 0..S-1, restarting after every eod with `reset_position_ids`;
* `attention_mask` [B, 1, S, S] bool (with `create_attention_mask`) - Megatron's convention:
  True means "masked out" (may not attend); causal, and block-diagonal per document with
  `reset_attention_mask`;
* `actual_seq_len` [B, eod_pad_length] int32 (with `create_compressed_eod_mask`) - MindFormers'
  compressed document mask: the end offset (exclusive) of every document in the sample, in
  increasing order, i.e. `i + 1` for each eod at input position `i < S - 1`, followed by `S`,
  repeated up to `eod_pad_length` entries (trailing repeats are empty segments). This is the
  per-sample form of the cumulative `actual_seq_len` of variable-length flash attention; see
  `flatten_actual_seq_len` for the batch-flattened form. When a sample holds more documents than
  fit, the last entry is still `S` (the trailing documents merge into one segment) and a warning
  is logged once: the mask then lets those documents see each other, but no position is dropped.

Megatron's order of operations is kept: masks come from the raw tokens, then pad positions are
masked in the loss and their ids zeroed.
"""

from __future__ import annotations

import logging
from functools import lru_cache

import numpy as np

logger = logging.getLogger("mf_data")

COLUMNS = ("input_ids", "labels", "loss_mask", "position_ids", "attention_mask", "actual_seq_len")
_warned_overflow = [False]


@lru_cache(maxsize=8)
def causal_mask(seq: int) -> np.ndarray:
    mask = np.triu(np.ones((seq, seq), dtype=bool), k=1)
    mask.setflags(write=False)
    return mask


def build_columns(
    text: np.ndarray,
    *,
    add_extra_token: bool,
    eod: int | None,
    pad: int,
    check_pad: bool,
    reset_position_ids: bool,
    reset_attention_mask: bool,
    eod_mask_loss: bool,
    create_attention_mask: bool,
    create_compressed_eod_mask: bool,
    eod_pad_length: int,
) -> dict[str, np.ndarray]:
    """All columns for a [B, window] int64 `text` batch (see the module docstring)."""
    batch = text.shape[0]
    seq = text.shape[1] - 1 if add_extra_token else text.shape[1]
    # One allocation for the three int64 columns (each a contiguous [B, S] view): fewer fresh
    # pages to fault in per batch, which is most of the cost of assembling columns.
    block = np.empty((3, batch, seq), dtype=np.int64)
    tokens, labels, position_ids = block[0], block[1], block[2]
    if add_extra_token:
        tokens[...] = text[:, :-1]
        labels[...] = text[:, 1:]
    else:
        tokens[...] = text
        labels[:, :-1] = text[:, 1:]
        labels[:, -1] = pad
        check_pad = True
    out: dict[str, np.ndarray] = {}

    is_eod = tokens == eod if eod is not None else None
    loss_mask = np.ones((batch, seq), dtype=np.float32)
    if eod_mask_loss:
        loss_mask[is_eod] = 0.0

    arange = np.arange(seq, dtype=np.int64)
    if reset_position_ids:
        # A document starts at t when the input at t - 1 is eod; positions count from there.
        starts = np.zeros((batch, seq), dtype=np.int64)
        starts[:, 1:] = np.where(is_eod[:, :-1], arange[1:], 0)
        np.maximum.accumulate(starts, axis=1, out=starts)
        np.subtract(arange[None, :], starts, out=position_ids)
    else:
        position_ids[...] = arange

    if create_attention_mask:
        causal = causal_mask(seq)
        if reset_attention_mask:
            # Document number of each position = eods strictly before it; attend within one only.
            doc = np.zeros((batch, seq), dtype=np.int64)
            np.cumsum(is_eod[:, :-1], axis=1, out=doc[:, 1:])
            mask = doc[:, :, None] != doc[:, None, :]
            mask |= causal
        else:
            mask = np.broadcast_to(causal, (batch, seq, seq)).copy()
        out["attention_mask"] = mask[:, None, :, :]

    if create_compressed_eod_mask:
        out["actual_seq_len"] = _actual_seq_len(is_eod, eod_pad_length)

    if check_pad:
        pad_label = labels == pad
        loss_mask[pad_label] = 0.0
        labels[pad_label] = 0
        tokens[tokens == pad] = 0

    out["input_ids"] = tokens
    out["labels"] = labels
    out["loss_mask"] = loss_mask
    out["position_ids"] = position_ids
    return out


def _actual_seq_len(is_eod: np.ndarray, length: int) -> np.ndarray:
    batch, seq = is_eod.shape
    out = np.full((batch, length), seq, dtype=np.int32)
    for b in range(batch):
        ends = np.flatnonzero(is_eod[b, :-1]) + 1  # an eod in the last position ends at S anyway
        if ends.size >= length:
            if not _warned_overflow[0]:
                _warned_overflow[0] = True
                logger.warning(
                    "a sample holds %d documents, more than eod_pad_length=%d: its last documents share "
                    "one attention segment; raise eod_pad_length to keep them apart", ends.size + 1, length,
                )
            ends = ends[: length - 1]
        out[b, : ends.size] = ends
    return out


def flatten_actual_seq_len(actual_seq_len: np.ndarray, seq_length: int) -> np.ndarray:
    """Per-sample end offsets [B, L] -> one cumulative list for the batch laid end to end.

    Row b is shifted by b * seq_length, which is the `actual_seq_len` a variable-length attention
    kernel expects when the batch is flattened into one sequence of B * seq_length tokens
    (MindFormers does this when batching; mf-data keeps samples independent).
    """
    batch = actual_seq_len.shape[0]
    offsets = (np.arange(batch, dtype=np.int64) * seq_length)[:, None]
    return (actual_seq_len.astype(np.int64) + offsets).reshape(-1)
