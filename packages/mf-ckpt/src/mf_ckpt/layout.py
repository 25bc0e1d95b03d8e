"""The in-memory description of a checkpoint every source is turned into, and its validation.

A tensor is a dtype, a global shape and chunks: boxes of the global tensor, each stored as one
tensor (`key`) of one safetensors file. mf checkpoints store each chunk with exactly its box
shape; Hugging Face sources reuse the model with `squeeze` (an expert's [I, H] tensor is the
[1, I, H] box of a stacked [E, I, H] tensor), `src_start` (a box inside a fused tensor) and
`transpose` (a 2-D box stored transposed: GPT-2's Conv1D weights).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import dtypes
from .errors import CheckpointError, brief

PARTS = ("model", "optimizer")


@dataclass(frozen=True)
class Chunk:
    offset: tuple[int, ...]
    shape: tuple[int, ...]
    file: str
    key: str
    src_start: tuple[int, ...] | None = None
    squeeze: tuple[int, ...] = ()
    checksum: int | None = None  # CRC32C of the stored tensor's bytes (None: not recorded)
    transpose: bool = False      # the stored region is the box transposed (2-D, no squeeze)

    def is_whole(self, offset: tuple[int, ...], shape: tuple[int, ...]) -> bool:
        """True when box (offset, shape) is this whole chunk and the chunk is its whole stored
        tensor (what a checksum covers)."""
        return self.src_start is None and offset == self.offset and shape == self.shape

    def stored_shape(self) -> tuple[int, ...]:
        """Shape of the region of the stored tensor this chunk occupies."""
        kept = tuple(n for axis, n in enumerate(self.shape) if axis not in self.squeeze)
        return kept[::-1] if self.transpose else kept

    def stored_region(self, offset: tuple[int, ...], shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """[start, stop) inside the stored tensor of global box (offset, shape) within this chunk."""
        if self.transpose:
            rel = [o - co for o, co in zip(offset, self.offset)][::-1]
            first = [b + r for b, r in zip(self.src_start or (0,) * len(rel), rel)]
            return tuple(first), tuple(a + n for a, n in zip(first, shape[::-1]))
        start, stop = [], []
        base = iter(self.src_start) if self.src_start is not None else None
        for axis, (o, n, co) in enumerate(zip(offset, shape, self.offset)):
            if axis in self.squeeze:
                continue
            s = (o - co) + (next(base) if base is not None else 0)
            start.append(s)
            stop.append(s + n)
        return tuple(start), tuple(stop)


@dataclass
class TensorMeta:
    dtype: str
    shape: tuple[int, ...]
    chunks: list[Chunk]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * dtypes.itemsize(self.dtype)


@dataclass
class CheckpointLayout:
    """What a load source holds: tensors per part ("model", "optimizer"), plus its common state."""

    kind: str  # "mf", "hf" or "safetensors"
    root: Path
    parts: dict[str, dict[str, TensorMeta]]
    iteration: int | None = None
    common: dict[str, Any] = field(default_factory=dict)
    per_rank: list[Any] | None = None
    world_size: int | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def files(self) -> set[str]:
        return {c.file for part in self.parts.values() for t in part.values() for c in t.chunks}


def check_coverage(where: str, name: str, shape: tuple[int, ...], boxes: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> None:
    """Chunks must tile the tensor exactly: inside its bounds, no holes, no overlaps."""
    for off, shp in boxes:
        if len(off) != len(shape) or len(shp) != len(shape) or any(
            o < 0 or n < 0 or o + n > g for o, n, g in zip(off, shp, shape)
        ):
            raise CheckpointError(f"{where}: tensor {name!r} chunk at {list(off)} size {list(shp)} lies outside {list(shape)}")
    total = math.prod(shape)
    if total == 0:
        return
    boxes = [b for b in boxes if math.prod(b[1])]
    split_axes = {d for off, shp in boxes for d in range(len(shape)) if off[d] != 0 or shp[d] != shape[d]}
    if len(split_axes) <= 1:
        # The common case (one split axis, the rest full): the intervals along it must tile [0, n).
        d = split_axes.pop() if split_axes else 0
        n = shape[d] if shape else 1
        end = 0
        for off, shp in sorted(boxes, key=lambda b: b[0][d] if shape else 0):
            lo, hi = (off[d], off[d] + shp[d]) if shape else (0, 1)
            if lo < end:
                raise CheckpointError(f"{where}: tensor {name!r} has overlapping chunks")
            if lo > end:
                at = [end if a == d else 0 for a in range(len(shape))]
                raise CheckpointError(f"{where}: tensor {name!r} is not fully covered by its chunks (nothing stored at {at})")
            end = hi
        if end < n:
            at = [end if a == d else 0 for a in range(len(shape))]
            raise CheckpointError(f"{where}: tensor {name!r} is not fully covered by its chunks (nothing stored at {at})")
        return
    volume = sum(math.prod(s) for _, s in boxes)
    bounds = [sorted({0, g} | {o for o, _ in ax} | {o + n for o, n in ax})
              for g, ax in zip(shape, ([(b[0][d], b[1][d]) for b in boxes] for d in range(len(shape))))]
    cells = math.prod(len(b) - 1 for b in bounds)
    if cells > 4_000_000:  # pathological layouts: the volume check alone still catches holes+overlaps mostly
        if volume != total:
            raise CheckpointError(f"{where}: tensor {name!r} chunks hold {volume} elements, tensor has {total}")
        return
    count = np.zeros([len(b) - 1 for b in bounds], dtype=np.int32)
    for off, shp in boxes:
        index = tuple(slice(int(np.searchsorted(b, o)), int(np.searchsorted(b, o + n))) for b, o, n in zip(bounds, off, shp))
        count[index] += 1
    if (count > 1).any():
        raise CheckpointError(f"{where}: tensor {name!r} has overlapping chunks")
    if (count == 0).any():
        hole = tuple(int(i[0]) for i in np.nonzero(count == 0))
        at = [b[i] for b, i in zip(bounds, hole)]
        raise CheckpointError(f"{where}: tensor {name!r} is not fully covered by its chunks (nothing stored at {at})")


def _int_list(value, what: str, where: str) -> tuple[int, ...]:
    # type() rather than isinstance: bools are not sizes, and this runs per chunk on every rank.
    if type(value) is not list or not all(type(v) is int and v >= 0 for v in value):
        raise CheckpointError(f"{where}: {what} must be a list of non-negative integers, got {brief(value)}")
    return tuple(value)


def parse_tensors(obj, where: str, checksums: dict[str, list[int]] | None = None) -> dict[str, TensorMeta]:
    """Validate one part of metadata.json ({name: {dtype, shape, chunks}}); `checksums` ({name:
    [crc per chunk]}, when the metadata records them) must cover every chunk."""
    if not isinstance(obj, dict):
        raise CheckpointError(f"{where}: expected an object of tensors")
    out = {}
    for name, entry in obj.items():
        if not isinstance(entry, dict):
            raise CheckpointError(f"{where}: tensor {name!r} entry is not an object")
        code = entry.get("dtype")
        if code not in dtypes.CODES:
            raise CheckpointError(f"{where}: tensor {name!r} has unsupported dtype {brief(code)}")
        shape = _int_list(entry.get("shape"), f"tensor {name!r} shape", where)
        chunks_obj = entry.get("chunks")
        if type(chunks_obj) is not list:
            raise CheckpointError(f"{where}: tensor {name!r} has no chunk list")
        sums = None if checksums is None else checksums.get(name)
        counted = sums is None or len(sums) == len(chunks_obj)
        chunks = []
        for i, c in enumerate(chunks_obj):
            try:
                file, key, offset, size = c["file"], c["key"], c["offset"], c["shape"]
            except (TypeError, KeyError):
                raise CheckpointError(f"{where}: tensor {name!r} has a malformed chunk {brief(c)}") from None
            if type(file) is not str or type(key) is not str:
                raise CheckpointError(f"{where}: tensor {name!r} has a malformed chunk {brief(c)}")
            chunks.append(Chunk(_int_list(offset, f"tensor {name!r} chunk offset", where),
                                _int_list(size, f"tensor {name!r} chunk shape", where), file, key,
                                checksum=sums[i] if sums is not None and counted else None))
        check_coverage(where, name, shape, [(c.offset, c.shape) for c in chunks])
        if checksums is not None and not (sums is not None and counted):
            raise CheckpointError(f"{where}: tensor {name!r} has {len(chunks)} chunk(s) but "
                                  f"{'no' if sums is None else len(sums)} checksum(s)")
        out[name] = TensorMeta(code, shape, chunks)
    return out


def tensors_to_json(tensors: dict[str, TensorMeta]) -> dict[str, Any]:
    return {
        name: {
            "dtype": t.dtype,
            "shape": list(t.shape),
            "chunks": [{"offset": list(c.offset), "shape": list(c.shape), "file": c.file, "key": c.key} for c in t.chunks],
        }
        for name, t in tensors.items()
    }
