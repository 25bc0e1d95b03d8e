"""Read any box of a checkpoint tensor, whatever the chunking (used by merge, convert, verify)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from . import checksums, dtypes
from .layout import CheckpointLayout, Chunk
from .sharding import box_slices, intersect
from .st_io import ReaderPool


def read_box(layout: CheckpointLayout, pool: ReaderPool, part: str, name: str,
             offset: tuple[int, ...] | None = None, shape: tuple[int, ...] | None = None,
             verify: bool = True) -> np.ndarray:
    """Box (offset, shape) of tensor `name` (the whole tensor by default), assembled from chunks
    (each checked against its recorded checksum unless `verify` is false)."""
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
        read_region(pool, layout, part, name, chunk, inter[0], inter[1], verify, out=view)
    return out


def chunk_where(layout: CheckpointLayout, part: str, name: str, chunk: Chunk) -> str:
    return f"{layout.root / chunk.file}: tensor {chunk.key!r} ({part} tensor {name!r}, chunk at {list(chunk.offset)})"


def read_region(pool: ReaderPool, layout: CheckpointLayout, part: str, name: str, chunk: Chunk,
                offset: tuple[int, ...], shape: tuple[int, ...], verify: bool, out: np.ndarray | None = None) -> np.ndarray:
    """Box (offset, shape) of one chunk in its stored dtype (into `out`, same shape, when given).
    With `verify` and a recorded checksum, the whole stored tensor is read (a checksum covers all
    of it) and checksummed block by block as it arrives; a box that is the whole chunk is read
    straight into `out` when it can be, so the check costs no extra read or copy."""
    reader = pool.get(layout.root / chunk.file)
    start, stop = chunk.stored_region(offset, shape)
    if chunk.transpose:   # stored [in, out] (Conv1D): read the stored region, hand back its transpose
        region = read_region(pool, layout, part, name, replace(chunk, transpose=False, shape=chunk.shape[::-1],
                                                                offset=chunk.offset[::-1]),
                             offset[::-1], shape[::-1], verify).T
        if out is None:
            return np.ascontiguousarray(region)
        dtypes.assign(out, region)
        return out
    if not (verify and chunk.checksum is not None):
        return reader.read(chunk.key, start, stop, out=out)
    whole = chunk.is_whole(offset, shape)
    data, value = reader.read_whole_checked(chunk.key, out if whole else None)
    checksums.check_value(value, chunk.checksum, chunk_where(layout, part, name, chunk))
    piece = data if whole else data[tuple(slice(a, b) for a, b in zip(start, stop))]
    if out is None:
        return piece
    if piece is not out:
        dtypes.assign(out, piece)
    return out
