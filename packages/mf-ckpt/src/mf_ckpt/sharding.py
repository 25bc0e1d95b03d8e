"""Sharded state: each rank's local piece of a global tensor, and helpers for the common layouts.

A `ShardedTensor` is a local numpy buffer plus where it sits in the global tensor
(`global_offset`) and which copy it is when several ranks hold the same piece (`replica_id`, e.g.
the data-parallel rank). The buffer may extend past the end of the global tensor (padding, as
FSDP pads a dimension to a multiple of the world size): only the part inside `global_shape` is
saved, and loading leaves the padding untouched.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import dtypes

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (offset, shape)


@dataclass
class ShardedTensor:
    data: np.ndarray
    global_shape: tuple[int, ...]
    global_offset: tuple[int, ...] = ()
    replica_id: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.data, np.ndarray):
            raise TypeError(f"ShardedTensor.data must be a numpy array, got {type(self.data).__name__}")
        self.global_shape = tuple(int(n) for n in self.global_shape)
        self.global_offset = tuple(int(o) for o in self.global_offset) or (0,) * len(self.global_shape)
        if len(self.global_offset) != len(self.global_shape) or self.data.ndim != len(self.global_shape):
            raise ValueError(
                f"ShardedTensor: data has {self.data.ndim} dims, global_shape {list(self.global_shape)}, "
                f"global_offset {list(self.global_offset)}"
            )
        if any(n < 0 for n in self.global_shape) or any(o < 0 for o in self.global_offset):
            raise ValueError(f"ShardedTensor: negative shape or offset {self.global_shape} {self.global_offset}")
        if not isinstance(self.replica_id, int) or self.replica_id < 0:
            raise ValueError(f"ShardedTensor: replica_id must be a non-negative int, got {self.replica_id!r}")

    @property
    def chunk_shape(self) -> tuple[int, ...]:
        """Shape of the part of `data` inside the global tensor (padding excluded)."""
        return tuple(
            max(0, min(n, g - o)) for n, g, o in zip(self.data.shape, self.global_shape, self.global_offset)
        )

    @property
    def chunk(self) -> np.ndarray:
        """View of the saved part of `data`."""
        return self.data[(*(slice(0, n) for n in self.chunk_shape), Ellipsis)]  # Ellipsis: 0-d stays a view

    @property
    def box(self) -> Box:
        return self.global_offset, self.chunk_shape

    @property
    def is_empty(self) -> bool:
        return math.prod(self.chunk_shape) == 0 and math.prod(self.global_shape) != 0


def replicated(data: np.ndarray, *, replica_id: int = 0) -> ShardedTensor:
    """The whole tensor, held by this rank as copy number `replica_id`."""
    data = np.asarray(data)
    return ShardedTensor(data, data.shape, (0,) * data.ndim, replica_id)


def split_sizes(n: int, parts: int) -> list[int]:
    """numpy.array_split sizes: the first n % parts pieces are one longer."""
    if parts < 1:
        raise ValueError(f"cannot split into {parts} parts")
    base, extra = divmod(n, parts)
    return [base + (1 if k < extra else 0) for k in range(parts)]


def _axes(axis, rank, world) -> list[tuple[int, int, int]]:
    if isinstance(axis, int):
        axis, rank, world = (axis,), (rank,), (world,)
    axis, rank, world = tuple(axis), tuple(rank), tuple(world)
    if not (len(axis) == len(rank) == len(world)):
        raise ValueError("axis, rank and world must have the same length")
    for a, r, w in zip(axis, rank, world):
        if w < 1 or not 0 <= r < w:
            raise ValueError(f"rank {r} is outside a world of {w} along axis {a}")
    return list(zip(axis, rank, world))


def _split(local, global_shape, axis, rank, world, replica_id, padded) -> ShardedTensor:
    local = np.asarray(local)
    global_shape = tuple(int(n) for n in global_shape)
    if local.ndim != len(global_shape):
        raise ValueError(f"local data has {local.ndim} dims, global shape {list(global_shape)}")
    offset = [0] * len(global_shape)
    for a, r, w in _axes(axis, rank, world):
        n = global_shape[a]
        if padded:
            per = -(-n // w)
            expected, offset[a] = per, r * per
        else:
            sizes = split_sizes(n, w)
            expected, offset[a] = sizes[r], sum(sizes[:r])
        if local.shape[a] != expected:
            kind = "padded" if padded else "even"
            raise ValueError(
                f"{kind} split of {n} over {w}: rank {r} should hold {expected} along axis {a}, has {local.shape[a]}"
            )
    for a, n in enumerate(global_shape):
        if a not in {ax for ax, _, _ in _axes(axis, rank, world)} and local.shape[a] != n:
            raise ValueError(f"axis {a} is not split but local size {local.shape[a]} != global {n}")
    return ShardedTensor(local, global_shape, tuple(offset), replica_id)


def split_evenly(local, global_shape: Sequence[int], axis, rank, world, *, replica_id: int = 0) -> ShardedTensor:
    """This rank's piece of a split along `axis` (or several axes) into `world` near-equal parts.

    Sizes follow numpy.array_split (the first n % world ranks hold one more). For a 2-D split pass
    sequences: `axis=(0, 1), rank=(tp_rank, dp_rank), world=(tp, dp)`.
    """
    return _split(local, global_shape, axis, rank, world, replica_id, padded=False)


def split_padded(local, global_shape: Sequence[int], axis, rank, world, *, replica_id: int = 0) -> ShardedTensor:
    """Like split_evenly, but every rank holds ceil(n / world) rows and the last ones are padding."""
    return _split(local, global_shape, axis, rank, world, replica_id, padded=True)


def shard_array(global_array: np.ndarray, axis, rank, world, *, padded: bool = False, replica_id: int = 0) -> ShardedTensor:
    """Cut this rank's piece out of a full array (a view; padded pieces are zero-filled copies)."""
    global_array = np.asarray(global_array)
    index = [slice(None)] * global_array.ndim
    pad = [(0, 0)] * global_array.ndim
    for a, r, w in _axes(axis, rank, world):
        n = global_array.shape[a]
        if padded:
            per = -(-n // w)
            start, stop = min(r * per, n), min((r + 1) * per, n)
            pad[a] = (0, per - (stop - start))
        else:
            sizes = split_sizes(n, w)
            start = sum(sizes[:r])
            stop = start + sizes[r]
        index[a] = slice(start, stop)
    local = global_array[tuple(index)]
    if padded and any(p != (0, 0) for p in pad):
        local = np.pad(local, pad)
    build = split_padded if padded else split_evenly
    return build(local, global_array.shape, axis, rank, world, replica_id=replica_id)


def intersect(a: Box, b: Box) -> Box | None:
    """Intersection of two boxes, or None if it is empty."""
    off, shape = [], []
    for ao, an, bo, bn in zip(a[0], a[1], b[0], b[1]):
        lo, hi = max(ao, bo), min(ao + an, bo + bn)
        if hi <= lo:
            return None
        off.append(lo)
        shape.append(hi - lo)
    return tuple(off), tuple(shape)


def box_slices(box: Box, origin: Sequence[int]) -> tuple[slice, ...]:
    """Index selecting `box` inside an array whose element 0 sits at global `origin` (a view, even 0-d)."""
    return (*(slice(o - g, o - g + n) for o, n, g in zip(box[0], box[1], origin)), Ellipsis)


def write_box(dest: ShardedTensor, offset: Sequence[int], shape: Sequence[int], data: np.ndarray) -> None:
    """Copy `data` (box-shaped, any layout of the same elements) into the destination's box,
    converting floating dtypes to the destination's."""
    view = dest.data[box_slices((tuple(offset), tuple(shape)), dest.global_offset)]
    dtypes.assign(view, data.reshape(view.shape))
