"""safetensors files: validated header parsing, streaming writer, and byte-range reads.

The writer is our own (the format is an 8-byte little-endian header length, a JSON header padded
with spaces to 8 bytes, then the tensors back to back): it writes straight from the caller's
arrays without the full-file copy `safetensors.numpy.save_file` makes, handles BF16/F8 raw arrays,
accepts lazily produced tensors (so converters stream with bounded memory) and can fsync.
Files it writes are read back by `safetensors.safe_open` in the tests.

Reads take only the bytes a region needs: a region that is one contiguous byte run goes with
`os.preadv` straight into the destination buffer; a strided region goes through
`safe_open(...).get_slice` (numpy dtypes) or a read-only memmap (BF16/F8, which the numpy backend
of safetensors cannot materialise).
"""

from __future__ import annotations

import json
import math
import os
import struct
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import checksums as crc
from . import dtypes
from .errors import CheckpointError, brief
from .fsutil import loads_json

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the limit safetensors itself enforces


@dataclass(frozen=True)
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute file offset of the first byte
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class FileHeader:
    path: Path
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str] | None
    data_start: int
    size: int


def read_header(path: str | os.PathLike) -> FileHeader:
    """Parse and validate a safetensors header: every problem becomes one CheckpointError line."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes)")
            (n,) = struct.unpack("<Q", prefix)
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise CheckpointError(f"{path}: corrupt or truncated safetensors header (length {n}, file {size} bytes)")
            raw = f.read(n)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror or e})") from None
    header = loads_json(raw, str(path), "safetensors header")
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: safetensors header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise CheckpointError(f"{path}: __metadata__ must map strings to strings")
    data_start = 8 + n
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        tensors[name] = _tensor_info(path, name, entry, data_start)
    # safetensors requires the data section to be covered exactly, without gaps or overlaps.
    end = data_start
    for name, info in sorted(tensors.items(), key=lambda kv: (kv[1].start, kv[1].end)):
        if info.start != end:
            raise CheckpointError(f"{path}: tensor {name!r} data does not follow the previous tensor (gap or overlap)")
        end = info.end
    if end != size:
        raise CheckpointError(f"{path}: file is {size} bytes but its header describes {end} (truncated or padded)")
    return FileHeader(path, tensors, metadata, data_start, size)


def _tensor_info(path: Path, name: str, entry, data_start: int) -> TensorInfo:
    if not isinstance(entry, dict):
        raise CheckpointError(f"{path}: header entry {name!r} is not an object")
    code, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if code not in dtypes.CODES:
        raise CheckpointError(f"{path}: tensor {name!r} has unsupported dtype {brief(code)}")
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        raise CheckpointError(f"{path}: tensor {name!r} has an invalid shape {brief(shape)}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int and o >= 0 for o in offsets)):
        raise CheckpointError(f"{path}: tensor {name!r} has invalid data_offsets {brief(offsets)}")
    nbytes = math.prod(shape) * dtypes.itemsize(code)
    if offsets[1] - offsets[0] != nbytes:
        raise CheckpointError(
            f"{path}: tensor {name!r} {code}{shape} needs {nbytes} bytes but data_offsets span {offsets[1] - offsets[0]}"
        )
    return TensorInfo(code, tuple(shape), data_start + offsets[0], data_start + offsets[1])


# ----------------------------------------------------------------------------------------- write

ArraySource = np.ndarray | Callable[[], np.ndarray]
_CRC_BLOCK = 4 << 20  # bytes written, then checksummed, at a time


@dataclass(frozen=True)
class Entry:
    """One tensor to write: its declared dtype code and shape, and the array (or a producer)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    source: ArraySource

    @classmethod
    def of(cls, name: str, arr: np.ndarray) -> Entry:
        return cls(name, dtypes.code_of(arr.dtype), tuple(arr.shape), arr)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * dtypes.itemsize(self.dtype)


def write_file(
    path: str | os.PathLike,
    entries: Sequence[Entry],
    metadata: dict[str, str] | None = None,
    *,
    fsync: bool = False,
    on_bytes: Callable[[int], None] | None = None,
    checksums: dict[str, int] | None = None,
) -> int:
    """Write one safetensors file; returns its size. Tensors are laid out in the given order.
    `checksums`, when given, receives each tensor's CRC32C, computed from the buffer as it is
    written (no second pass over the data)."""
    header: dict = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for e in entries:
        if e.name in header or e.name == "__metadata__":
            raise CheckpointError(f"{path}: duplicate tensor name {e.name!r}")
        header[e.name] = {"dtype": e.dtype, "shape": list(e.shape), "data_offsets": [offset, offset + e.nbytes]}
        offset += e.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb", buffering=0) as f:
        _write_all(f, struct.pack("<Q", len(blob)) + blob)
        for e in entries:
            arr = e.source() if callable(e.source) else e.source
            arr = np.asarray(arr)
            if dtypes.code_of(arr.dtype) != e.dtype or tuple(arr.shape) != tuple(e.shape):
                raise CheckpointError(
                    f"{path}: tensor {e.name!r} is {dtypes.code_of(arr.dtype)}{list(arr.shape)}, "
                    f"declared {e.dtype}{list(e.shape)}"
                )
            if checksums is None:
                if arr.size:
                    _write_all(f, _bytes_view(arr))
            else:
                # Block by block, each checksummed right after it is written, while still in cache.
                view, value = _bytes_view(arr), 0
                for at in range(0, view.nbytes, _CRC_BLOCK):
                    block = view[at : at + _CRC_BLOCK]
                    _write_all(f, block)
                    value = crc.update(value, block)
                checksums[e.name] = value
            if on_bytes is not None:
                on_bytes(e.nbytes)
        if fsync:
            os.fsync(f.fileno())
    return 8 + len(blob) + offset


def _bytes_view(arr: np.ndarray) -> memoryview:
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return memoryview(arr.reshape(-1).view(np.uint8))


def _write_all(f, data) -> None:
    view = memoryview(data)
    while view.nbytes:
        written = f.write(view)
        if not written:
            raise OSError("short write")
        view = view[written:]


# ------------------------------------------------------------------------------------------ read


def contiguous_run(shape: Sequence[int], start: Sequence[int], stop: Sequence[int]) -> tuple[int, int] | None:
    """(first element, element count) if box [start, stop) of a C-ordered array is one run, else None."""
    ndim = len(shape)
    k = 0
    while k < ndim and stop[k] - start[k] == 1:
        k += 1
    for j in range(k + 1, ndim):
        if start[j] != 0 or stop[j] != shape[j]:
            return None
    first = 0
    for j in range(ndim):
        first = first * shape[j] + start[j]
    count = 1
    for j in range(ndim):
        count *= stop[j] - start[j]
    return first, count


class FileReader:
    """One open safetensors file, shared by reader threads (pread needs no seek lock)."""

    def __init__(self, header: FileHeader):
        self.header = header
        self._fd = os.open(header.path, os.O_RDONLY)
        self._lock = threading.Lock()
        self._safe = None
        self._memmap = None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._safe = None
        self._memmap = None

    def read(self, key: str, start: Sequence[int], stop: Sequence[int], out: np.ndarray | None = None) -> np.ndarray:
        """Box [start, stop) of tensor `key`, in its stored dtype; into `out` when given (same shape)."""
        info = self.header.tensors[key]
        dt = dtypes.numpy_dtype(info.dtype)
        shape = tuple(b - a for a, b in zip(start, stop))
        run = contiguous_run(info.shape, start, stop)
        if run is not None:
            direct = out is not None and out.dtype == dt and out.flags.c_contiguous
            target = out if direct else np.empty(shape, dt)
            first, count = run
            self._pread_into(target, info.start + first * dt.itemsize, count * dt.itemsize)
            if out is None or direct:
                return target
            data = target
        else:
            slices = tuple(slice(a, b) for a, b in zip(start, stop))
            if dtypes.is_raw(info.dtype):
                data = self._raw_array(info)[slices]
            else:
                data = self._safe_open().get_slice(key)[slices]
            if out is None:
                return np.ascontiguousarray(data)
        dtypes.assign(out, data)
        return out

    def read_whole_checked(self, key: str, out: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """The whole stored tensor `key` and the CRC32C of its bytes, computed block by block as
        they arrive (each block checksummed while still in cache: one pass over memory). Into
        `out` when it is C-contiguous in the stored dtype and shape."""
        info = self.header.tensors[key]
        dt = dtypes.numpy_dtype(info.dtype)
        direct = out is not None and out.dtype == dt and out.flags.c_contiguous and tuple(out.shape) == info.shape
        target = out if direct else np.empty(info.shape, dt)
        view = memoryview(target.reshape(-1).view(np.uint8))
        value = 0
        for at in range(0, view.nbytes, _CRC_BLOCK):
            block = view[at : at + _CRC_BLOCK]
            self._pread_block(block, info.start + at)
            value = crc.update(value, block)
        return target, value

    def _pread_block(self, view: memoryview, offset: int) -> None:
        done = 0
        while done < view.nbytes:
            got = os.preadv(self._fd, [view[done:]], offset + done)
            if got <= 0:
                raise CheckpointError(f"{self.header.path}: unexpected end of file (truncated after validation?)")
            done += got

    def _pread_into(self, out: np.ndarray, offset: int, nbytes: int) -> None:
        view = memoryview(out.reshape(-1).view(np.uint8))
        if view.nbytes != nbytes:
            raise AssertionError("destination size does not match the byte run")
        done = 0
        while done < nbytes:
            got = os.preadv(self._fd, [view[done:]], offset + done)
            if got <= 0:
                raise CheckpointError(f"{self.header.path}: unexpected end of file (truncated after validation?)")
            done += got

    def _safe_open(self):
        with self._lock:
            if self._safe is None:
                from safetensors import safe_open

                try:
                    self._safe = safe_open(str(self.header.path), framework="np")
                except Exception as e:  # safetensors raises its own error type
                    raise CheckpointError(f"{self.header.path}: {e}") from None
            return self._safe

    def _raw_array(self, info: TensorInfo) -> np.ndarray:
        with self._lock:
            if self._memmap is None:
                self._memmap = np.memmap(self.header.path, dtype=np.uint8, mode="r")
        dt = dtypes.numpy_dtype(info.dtype)
        return self._memmap[info.start : info.end].view(dt).reshape(info.shape)


class ReaderPool:
    """Lazily opened FileReaders keyed by path, closed together."""

    def __init__(self, headers: dict[Path, FileHeader] | None = None):
        self._headers = dict(headers or {})
        self._readers: dict[Path, FileReader] = {}
        self._lock = threading.Lock()

    def get(self, path: Path) -> FileReader:
        with self._lock:
            reader = self._readers.get(path)
            if reader is None:
                header = self._headers.get(path) or read_header(path)
                reader = self._readers[path] = FileReader(header)
            return reader

    def close(self) -> None:
        with self._lock:
            for reader in self._readers.values():
                reader.close()
            self._readers.clear()

    def __enter__(self) -> ReaderPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_tensors(path: str | os.PathLike, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Whole tensors of one file (all, or `names`), in mf-ckpt's dtypes."""
    header = read_header(path)
    wanted = list(header.tensors) if names is None else list(names)
    reader = FileReader(header)
    try:
        out = {}
        for name in wanted:
            info = header.tensors[name]
            out[name] = reader.read(name, (0,) * len(info.shape), info.shape)
        return out
    finally:
        reader.close()
