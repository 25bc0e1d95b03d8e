"""What is in a `.bin/.idx` pair: counts, dtype and document length percentiles (and, for SFT
data with a loss-mask channel beside it, how many tokens are response tokens)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .indexed_dataset import IndexedDataset, get_bin_path, get_idx_path
from .sft_indexed import SFTIndexedDataset, loss_mask_prefix

PERCENTILES = (50, 90, 99)


def summarize(path_prefix: str) -> dict[str, Any]:
    ds = IndexedDataset(path_prefix)
    lengths = ds.sequence_lengths.astype(np.int64)
    ends = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=ends[1:])
    bounds = ds.document_indices
    doc_tokens = ends[bounds[1:]] - ends[bounds[:-1]]
    stats: dict[str, Any] = {
        "prefix": path_prefix,
        "dtype": np.dtype(ds.dtype).name,
        "documents": int(doc_tokens.size),
        "sequences": len(ds),
        "tokens": int(lengths.sum()),
        "empty_documents": int((doc_tokens == 0).sum()),
        "bin_bytes": os.path.getsize(get_bin_path(path_prefix)),
    }
    if os.path.isfile(get_idx_path(loss_mask_prefix(path_prefix))):
        mask = SFTIndexedDataset(path_prefix).mask.token_array()  # opening checks the channel
        if mask is not None:
            stats["response_tokens"] = int(np.count_nonzero(mask))
    if doc_tokens.size:
        stats["document_tokens"] = {
            "min": int(doc_tokens.min()),
            "mean": float(doc_tokens.mean()),
            **{f"p{p}": float(np.percentile(doc_tokens, p)) for p in PERCENTILES},
            "max": int(doc_tokens.max()),
        }
    return stats


def format_summary(stats: dict[str, Any]) -> str:
    lines = [
        f"prefix      {stats['prefix']}",
        f"dtype       {stats['dtype']}",
        f"documents   {stats['documents']}  (empty: {stats['empty_documents']})",
        f"sequences   {stats['sequences']}",
        f"tokens      {stats['tokens']}",
        *([f"response    {stats['response_tokens']}  (loss-mask channel {stats['prefix']}_loss_mask)"]
          if "response_tokens" in stats else []),
        f"bin bytes   {stats['bin_bytes']}",
    ]
    d = stats.get("document_tokens")
    if d:
        pct = "  ".join(f"p{p} {d[f'p{p}']:g}" for p in PERCENTILES)
        lines.append(f"doc tokens  min {d['min']}  mean {d['mean']:.1f}  {pct}  max {d['max']}")
    return "\n".join(lines)
