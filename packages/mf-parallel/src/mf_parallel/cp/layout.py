"""Which tokens a context-parallel rank holds, and a batch sliced for it (numpy only).

The sequence of S tokens is cut into 2 x cp equal chunks; cp rank r holds chunks r and 2cp-1-r,
in that order (head-tail, or zigzag). Under a causal mask a query at position i attends to about i
keys, so chunk r is cheap and chunk 2cp-1-r expensive, and every rank gets the same total work
(Megatron-Core's `get_batch_on_this_cp_rank` uses the same layout). The ring attention's block
masks, its skipped blocks and the global RoPE positions all follow from this one rule, which is
why it lives here, next to the attention Cells, and why the loader slices through it rather
than through a copy of it.

Packed documents. Under context parallelism no rank holds a whole [S, S] mask. The document
structure travels instead as `segment_ids` [B, S] int32 for the FULL sequence (the same on every
cp rank; S int32 per sample, like the global `cu_seqlens` every rank gets on Megatron's THD path):
key j is visible to query i iff j <= i and segment_ids[i] == segment_ids[j] >= 0. A negative id
marks a token that attends to nothing and that nothing attends to (a fully masked row: the
attention then averages all values uniformly, as CoreAttention's finite mask value does).
`slice_for_context_parallel` derives segment ids from either form mf-data produces:
- `attention_mask` [B, 1, S, S] (reset_attention_mask: block-diagonal causal, True = masked out),
  checked to be exactly that shape of mask, else refused with the reason;
- `actual_seq_len` [B, L] (create_compressed_eod_mask: exclusive end of each document).
Megatron's THD path instead splits every document into 2 x cp chunks, which needs each document
padded to a multiple of 2 x cp; a sequence-level split keeps packed windows as mf-data cuts them.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from mf_parallel.errors import ParallelConfigError

# Columns laid out along the sequence: sliced with the same index on every one of them.
SEQUENCE_COLUMNS: tuple[str, ...] = ("input_ids", "labels", "loss_mask", "position_ids")
# Columns describing the attention pattern: replaced by the global `segment_ids`.
MASK_COLUMNS: tuple[str, ...] = ("attention_mask", "actual_seq_len", "segment_ids")


def check_sequence_length(seq_len: int, cp: int) -> None:
    """Raise unless `seq_len` splits into 2 x cp equal chunks."""
    if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1:
        raise ParallelConfigError(f"parallelism.context_parallel: must be a positive integer, got {cp!r}")
    if seq_len < 2 * cp or seq_len % (2 * cp):
        raise ParallelConfigError(
            f"parallelism.context_parallel: a sequence of {seq_len} tokens does not split into 2 x context_parallel "
            f"= {2 * cp} equal chunks (rank r holds chunks r and {2 * cp - 1}-r); use a seq_length divisible by "
            f"{2 * cp}")


def zigzag_chunks(cp: int, cp_rank: int) -> tuple[int, int]:
    """The two chunk indices (of 2 x cp) that cp rank `cp_rank` holds, in local order."""
    if not 0 <= cp_rank < cp:
        raise ParallelConfigError(f"context parallel rank {cp_rank} is outside 0..{cp - 1}")
    return cp_rank, 2 * cp - 1 - cp_rank


def zigzag_indices(seq_len: int, cp: int, cp_rank: int) -> np.ndarray:
    """Global token positions held by `cp_rank`, in its local order ([seq_len // cp] int64)."""
    check_sequence_length(seq_len, cp)
    chunk = seq_len // (2 * cp)
    first, second = zigzag_chunks(cp, cp_rank)
    return np.concatenate([np.arange(first * chunk, (first + 1) * chunk),
                           np.arange(second * chunk, (second + 1) * chunk)]).astype(np.int64)


def masked_from_segments(segment_ids: np.ndarray) -> np.ndarray:
    """[B, S, S] bool, True = masked out (Megatron's convention): the mask `segment_ids` stands for."""
    seg = np.asarray(segment_ids)
    seq = seg.shape[-1]
    causal = np.triu(np.ones((seq, seq), dtype=bool), k=1)
    same = seg[:, :, None] == seg[:, None, :]
    return causal[None] | ~same | (seg < 0)[:, :, None]


def segment_ids_from_attention_mask(attention_mask: np.ndarray) -> np.ndarray:
    """[B, S] int32 segment ids of a block-diagonal causal mask ([B, 1, S, S], [B, S, S] or [S, S];
    True/nonzero = masked out). A row that sees nothing gets -1. Refuses any other mask."""
    mask = np.asarray(attention_mask)
    if mask.ndim == 4 and mask.shape[1] == 1:
        mask = mask[:, 0]
    elif mask.ndim == 2:
        mask = mask[None]
    if mask.ndim != 3 or mask.shape[1] != mask.shape[2]:
        raise ParallelConfigError(
            f"context parallelism: attention_mask must be [B, 1, S, S] (or [B, S, S]), got shape {list(np.shape(attention_mask))}")
    masked = mask.astype(bool)
    visible = ~masked
    seen = visible.any(-1)
    # A block-diagonal causal row i sees [start of its document, i]: its first visible key names it.
    seg = np.where(seen, visible.argmax(-1), -1).astype(np.int32)
    bad = masked != masked_from_segments(seg)
    if bad.any():
        b, i, j = (int(x) for x in np.argwhere(bad)[0])
        raise ParallelConfigError(
            f"context parallelism: attention_mask of sample {b} is not causal within documents (query {i}, key {j} is "
            f"{'masked' if masked[b, i, j] else 'visible'}); context_parallel_mask_type 'causal' carries causal masks "
            f"and block-diagonal causal ones (reset_attention_mask) to the cp ranks")
    return seg


def segment_ids_from_actual_seq_len(actual_seq_len: np.ndarray, seq_len: int) -> np.ndarray:
    """[B, S] int32 segment ids (document index) from per-sample exclusive document ends [B, L]."""
    ends = np.asarray(actual_seq_len)
    if ends.ndim != 2:
        raise ParallelConfigError(
            f"context parallelism: actual_seq_len must be per sample [B, L] (mf-data's column), got shape "
            f"{list(ends.shape)}; the batch-flattened form cannot be split per sample")
    if not np.issubdtype(ends.dtype, np.integer):
        raise ParallelConfigError(f"context parallelism: actual_seq_len must be integers, got {ends.dtype}")
    if (ends < 0).any() or (ends > seq_len).any() or (np.diff(ends, axis=1) < 0).any():
        raise ParallelConfigError(
            f"context parallelism: actual_seq_len must hold non-decreasing document ends within 0..{seq_len}")
    positions = np.arange(seq_len)
    # Document of token t = number of ends <= t (trailing repeats of S add nothing).
    return np.stack([np.searchsorted(row, positions, side="right") for row in ends]).astype(np.int32)


def slice_for_context_parallel(batch: Mapping[str, np.ndarray], cp: int, cp_rank: int) -> dict[str, np.ndarray]:
    """The columns cp rank `cp_rank` trains on, from a batch of full sequences (numpy, any framework).

    - input_ids, labels, loss_mask, position_ids [B, S] -> [B, S / cp]: the rank's two chunks, the
      same index for all, so every label stays beside its token. position_ids keep their global
      values (RoPE sees where a token really is); missing, they are the global 0..S-1.
    - attention_mask [B, 1, S, S] or actual_seq_len [B, L] -> segment_ids [B, S] int32 (global; see the
      module docstring), the model's attention input under a context-parallel plan. Without
      either, no segment_ids: plain causal attention.
    Any other column is refused: it could not be known whether it runs along the sequence.
    """
    unknown = sorted(set(batch) - set(SEQUENCE_COLUMNS) - set(MASK_COLUMNS))
    if unknown:
        raise ParallelConfigError(
            f"context parallelism: no slicing rule for column(s) {unknown}; known: "
            f"{', '.join(SEQUENCE_COLUMNS + MASK_COLUMNS)}")
    present = [c for c in MASK_COLUMNS if c in batch]
    if len(present) > 1:
        raise ParallelConfigError(f"context parallelism: give one of {', '.join(present)}, not several "
                                  "(each describes the whole attention pattern)")
    if "input_ids" not in batch:
        raise ParallelConfigError("context parallelism: the batch has no input_ids")
    ids = np.asarray(batch["input_ids"])
    if ids.ndim != 2:
        raise ParallelConfigError(f"context parallelism: input_ids must be [B, S], got shape {list(ids.shape)}")
    rows, seq = ids.shape
    index = zigzag_indices(seq, cp, cp_rank)
    out: dict[str, np.ndarray] = {}
    for name in SEQUENCE_COLUMNS:
        if name == "position_ids" and name not in batch:
            out[name] = np.broadcast_to(index, (rows, index.size)).copy()
            continue
        if name not in batch:
            continue
        value = np.asarray(batch[name])
        if value.shape != (rows, seq):
            raise ParallelConfigError(f"context parallelism: {name} has shape {list(value.shape)}, input_ids "
                                      f"{[rows, seq]}; sequence columns must match")
        out[name] = np.ascontiguousarray(value[:, index])
    if present:
        source = present[0]
        value = np.asarray(batch[source])
        if source == "attention_mask":
            seg = segment_ids_from_attention_mask(value)
        elif source == "actual_seq_len":
            seg = segment_ids_from_actual_seq_len(value, seq)
        else:
            seg = value.astype(np.int32)
        if seg.shape != (rows, seq):
            raise ParallelConfigError(f"context parallelism: {source} describes {list(seg.shape)} tokens, input_ids "
                                      f"{[rows, seq]}")
        out["segment_ids"] = np.ascontiguousarray(seg, dtype=np.int32)
    return out
