"""Read any box of a checkpoint tensor, whatever the chunking (used by merge, convert, verify)."""

from __future__ import annotations

import numpy as np

from . import dtypes
from .layout import CheckpointLayout
from .sharding import box_slices, intersect
from .st_io import ReaderPool


def read_box(layout: CheckpointLayout, pool: ReaderPool, part: str, name: str,
             offset: tuple[int, ...] | None = None, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """Box (offset, shape) of tensor `name` (the whole tensor by default), assembled from chunks."""
    meta = layout.parts[part][name]
    offset = tuple(offset) if offset is not None else (0,) * len(meta.shape)
    shape = tuple(shape) if shape is not None else meta.shape
    out = np.empty(shape, dtypes.numpy_dtype(meta.dtype))
    for chunk in meta.chunks:
        inter = intersect((offset, shape), (chunk.offset, chunk.shape))
        if inter is None:
            continue
        view = out[box_slices(inter, offset)]
        if chunk.squeeze:
            view = np.squeeze(view, axis=chunk.squeeze)
        start, stop = chunk.stored_region(*inter)
        pool.get(layout.root / chunk.file).read(chunk.key, start, stop, out=view)
    return out
