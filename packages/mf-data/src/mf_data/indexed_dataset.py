"""Megatron's `.idx`/`.bin` format: a memory-mapped reader and a byte-identical writer.

Layout of `<prefix>.idx` (little endian), exactly as Megatron-Core writes it:

    9 bytes   magic  b"MMIDIDX\\x00\\x00"
    u64       version (1)
    u8        dtype code of the tokens (see `DType`)
    u64       sequence count  N
    u64       document count  M   (entries of the document index, i.e. documents + 1)
    i32[N]    sequence lengths, in tokens
    i64[N]    sequence pointers, byte offsets into `<prefix>.bin`
    i64[M]    document index: sequence index at which each document starts, then N
    i8[N]     sequence modes (multimodal files only)

`<prefix>.bin` is the tokens of every sequence back to back. Reading validates the whole index
(sizes, monotonic pointers, that `.bin` holds what the index points at) so that a damaged file
fails at open time with one line naming it, never later with a crash or garbage samples.

Token range (an mf-data extension; the `.idx` stays byte-identical to Megatron's): the builder
records the smallest and largest token id it wrote in `<prefix>.stats.json` beside the pair, with
the size and mtime of both files. `IndexedDataset.token_range()` reads it when it still describes
the files, and otherwise (a pair Megatron wrote, or one changed since) scans the `.bin` once and
caches the result there (when the directory is writable), so checking a dataset against a
vocabulary costs a small JSON read.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from array import array
from enum import Enum
from typing import Any, NamedTuple

import numpy as np

from .errors import DataFileError, DataFileNotFoundError
from .fsutil import atomic_write_bytes, tmp_path_beside

_INDEX_HEADER = b"MMIDIDX\x00\x00"
_HEADER_SIZE = 9 + 8 + 1 + 8 + 8


class DType(Enum):
    """Token dtype codes stored in the `.idx` header (Megatron's numbering)."""

    uint8 = 1
    int8 = 2
    int16 = 3
    int32 = 4
    int64 = 5
    float64 = 6
    float32 = 7
    uint16 = 8

    @classmethod
    def code_from_dtype(cls, value: Any) -> int:
        return cls[np.dtype(value).name].value

    @classmethod
    def dtype_from_code(cls, value: int) -> type[np.number]:
        return getattr(np, cls(value).name)

    @staticmethod
    def size(key: Any) -> int:
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            return np.dtype(DType.dtype_from_code(int(key))).itemsize
        return np.dtype(key).itemsize

    @staticmethod
    def optimal_dtype(cardinality: int | None) -> type[np.number]:
        """uint16 for a vocabulary below 65500 tokens, else int32 (Megatron's rule)."""
        if cardinality is not None and cardinality < 65500:
            return np.uint16
        return np.int32


def get_idx_path(path_prefix: str) -> str:
    return path_prefix + ".idx"


def get_stats_path(path_prefix: str) -> str:
    return path_prefix + ".stats.json"


class TokenRange(NamedTuple):
    """Smallest and largest token id stored in a dataset."""

    min: int
    max: int


_STATS_FORMAT = "mf-data token stats"
_SCAN_BLOCK = 1 << 24  # tokens per block when scanning a .bin for its range


def _fingerprint(path_prefix: str) -> dict[str, list[int]]:
    out = {}
    for ext, path in (("bin", get_bin_path(path_prefix)), ("idx", get_idx_path(path_prefix))):
        st = os.stat(path)
        out[ext] = [st.st_size, st.st_mtime_ns]
    return out


def _write_stats(path_prefix: str, token_range: TokenRange | None, num_tokens: int) -> bool:
    """Record the range beside the pair; False when it cannot be written (a read-only directory)."""
    stats = {"format": _STATS_FORMAT, "version": 1, "files": _fingerprint(path_prefix), "num_tokens": num_tokens,
             "min_token": None if token_range is None else token_range.min,
             "max_token": None if token_range is None else token_range.max}
    try:
        atomic_write_bytes(get_stats_path(path_prefix), (json.dumps(stats, sort_keys=True) + "\n").encode())
    except OSError:
        return False
    return True


def _read_stats(path_prefix: str) -> tuple[bool, TokenRange | None]:
    """(found, range) from `<prefix>.stats.json` if it describes the files as they are now."""
    try:
        with open(get_stats_path(path_prefix), "rb") as f:
            stats = json.loads(f.read(1 << 16))
        if not (isinstance(stats, dict) and stats.get("format") == _STATS_FORMAT and stats.get("version") == 1
                and stats.get("files") == _fingerprint(path_prefix)):
            return False, None
        lo, hi = stats.get("min_token"), stats.get("max_token")
        if lo is None and hi is None:
            return True, None
        if type(lo) is int and type(hi) is int and lo <= hi:
            return True, TokenRange(lo, hi)
    except (OSError, ValueError, RecursionError):
        pass  # absent, stale or damaged: computed again
    return False, None


def get_bin_path(path_prefix: str) -> str:
    return path_prefix + ".bin"


class _IndexReader:
    """Parses and validates one `.idx` file (memory-mapped; nothing is copied)."""

    def __init__(self, idx_path: str, multimodal: bool, bin_size: int | None = None) -> None:
        self.idx_path = idx_path
        try:
            file_size = os.path.getsize(idx_path)
        except FileNotFoundError:
            raise DataFileNotFoundError(f"{idx_path}: index file not found") from None
        if file_size < _HEADER_SIZE:
            raise DataFileError(f"{idx_path}: truncated index: {file_size} bytes, the header alone is {_HEADER_SIZE}")
        with open(idx_path, "rb") as stream:
            header = stream.read(_HEADER_SIZE)
        if header[:9] != _INDEX_HEADER:
            raise DataFileError(f"{idx_path}: not a Megatron index file (bad magic {header[:9]!r})")
        (version,) = struct.unpack("<Q", header[9:17])
        if version != 1:
            raise DataFileError(f"{idx_path}: unsupported index version {version} (only 1 is known)")
        code = header[17]
        try:
            self.dtype = DType.dtype_from_code(code)
        except ValueError:
            raise DataFileError(f"{idx_path}: unknown dtype code {code} (known: 1..8)") from None
        self.dtype_size = np.dtype(self.dtype).itemsize
        self.sequence_count, self.document_count = struct.unpack("<QQ", header[18:34])
        n, m = self.sequence_count, self.document_count
        needed = _HEADER_SIZE + n * (4 + 8) + m * 8 + (n if multimodal else 0)
        if file_size < needed:
            raise DataFileError(
                f"{idx_path}: truncated index: header says {n} sequences and {m} document entries "
                f"({needed} bytes) but the file has {file_size} bytes"
            )
        self._mmap = np.memmap(idx_path, mode="r", dtype=np.uint8)
        buf = self._mmap
        off = _HEADER_SIZE
        self.sequence_lengths = np.frombuffer(buf, dtype=np.int32, count=n, offset=off)
        off += 4 * n
        self.sequence_pointers = np.frombuffer(buf, dtype=np.int64, count=n, offset=off)
        off += 8 * n
        self.document_indices = np.frombuffer(buf, dtype=np.int64, count=m, offset=off)
        off += 8 * m
        self.sequence_modes = np.frombuffer(buf, dtype=np.int8, count=n, offset=off) if multimodal else None
        self._validate(bin_size)

    def _validate(self, bin_size: int | None) -> None:
        path, n = self.idx_path, self.sequence_count
        docs = self.document_indices
        if docs.size == 0:
            raise DataFileError(f"{path}: empty documents list (the document index has no entries)")
        if docs.size == 1:
            raise DataFileError(f"{path}: contains no documents")
        if docs[0] != 0:
            raise DataFileError(f"{path}: document index must start at 0, starts at {int(docs[0])}")
        steps = np.diff(docs)
        if steps.size and steps.min() < 0:
            i = int(np.argmax(steps < 0)) + 1
            raise DataFileError(f"{path}: non-monotonic document index at entry {i}")
        if docs[-1] != n:
            raise DataFileError(f"{path}: document index ends at {int(docs[-1])}, expected the sequence count {n}")
        if n == 0:
            return
        lengths, pointers = self.sequence_lengths, self.sequence_pointers
        if lengths.min() < 0:
            raise DataFileError(f"{path}: negative length at sequence {int(np.argmax(lengths < 0))}")
        if pointers[0] < 0:
            raise DataFileError(f"{path}: negative pointer at sequence 0")
        dp = np.diff(pointers)
        if dp.size and dp.min() < 0:
            i = int(np.argmax(dp < 0)) + 1
            raise DataFileError(
                f"{path}: non-monotonic sequence pointers at sequence {i} "
                f"({int(pointers[i - 1])} then {int(pointers[i])})"
            )
        if np.any(pointers % self.dtype_size):
            i = int(np.argmax(pointers % self.dtype_size != 0))
            raise DataFileError(f"{path}: pointer of sequence {i} is not a multiple of the token size {self.dtype_size}")
        if bin_size is not None:
            end = int((pointers + lengths.astype(np.int64) * self.dtype_size).max())
            if end > bin_size:
                bin_path = self.idx_path[: -len(".idx")] + ".bin"
                raise DataFileError(
                    f"{bin_path}: shorter than its index says: {bin_size} bytes, the index needs {end}"
                )


class IndexedDataset:
    """Memory-mapped reader of a Megatron `.idx`/`.bin` pair.

    `ds[i]` is sequence i (a read-only numpy view when memory-mapped), `ds[a:b]` a list of them,
    `ds.get(i, offset, length)` part of one. `sequence_lengths`, `sequence_pointers` and
    `document_indices` are the index arrays. `mmap=False` reads with `pread` instead of mapping.
    """

    def __init__(self, path_prefix: str, multimodal: bool = False, mmap: bool = True) -> None:
        self._initialize(os.fspath(path_prefix), multimodal, mmap)

    def _initialize(self, path_prefix: str, multimodal: bool, mmap: bool) -> None:
        self.path_prefix = path_prefix
        self.multimodal = multimodal
        self.mmap = mmap
        idx_path, bin_path = get_idx_path(path_prefix), get_bin_path(path_prefix)
        missing = [p for p in (idx_path, bin_path) if not os.path.isfile(p)]
        if missing:
            raise DataFileNotFoundError(
                f"{missing[0]}: not found (dataset prefix {path_prefix!r} needs {os.path.basename(bin_path)} "
                f"and {os.path.basename(idx_path)})"
            )
        bin_size = os.path.getsize(bin_path)
        self.index = _IndexReader(idx_path, multimodal, bin_size)
        self._bin_path = bin_path
        self._num_tokens: int | None = None
        self._fd: int | None = None
        if mmap and bin_size > 0:
            self._bin_mmap = np.memmap(bin_path, mode="r", dtype=np.uint8)
            usable = bin_size - bin_size % self.index.dtype_size
            # A plain ndarray over the mapping: slicing it costs a fraction of np.memmap's slicing.
            self._tokens = np.frombuffer(self._bin_mmap, dtype=self.index.dtype, count=usable // self.index.dtype_size)
        elif mmap:
            self._bin_mmap = None
            self._tokens = np.empty(0, dtype=self.index.dtype)
        else:
            self._bin_mmap = None
            self._tokens = None
            self._fd = os.open(bin_path, os.O_RDONLY)  # pread takes explicit offsets: one fd serves all threads

    # --- pickling: re-open the files instead of copying the mappings --------------------------
    def __getstate__(self) -> tuple[str, bool, bool]:
        return (self.path_prefix, self.multimodal, self.mmap)

    def __setstate__(self, state: tuple[str, bool, bool]) -> None:
        self._initialize(*state)

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            os.close(fd)

    # --- the Megatron API -----------------------------------------------------------------
    def __len__(self) -> int:
        return self.index.sequence_count

    @property
    def dtype(self) -> type[np.number]:
        return self.index.dtype

    @property
    def sequence_lengths(self) -> np.ndarray:
        return self.index.sequence_lengths

    @property
    def sequence_pointers(self) -> np.ndarray:
        return self.index.sequence_pointers

    @property
    def document_indices(self) -> np.ndarray:
        return self.index.document_indices

    @property
    def sequence_modes(self) -> np.ndarray | None:
        return self.index.sequence_modes

    def _read(self, count: int, item_offset: int) -> np.ndarray:
        if self._tokens is not None:
            return self._tokens[item_offset : item_offset + count]
        out = np.empty(count, dtype=self.index.dtype)
        if count:
            assert self._fd is not None
            nbytes = os.preadv(self._fd, [memoryview(out).cast("B")], item_offset * self.index.dtype_size)
            if nbytes != out.nbytes:
                raise DataFileError(f"{self._bin_path}: short read ({nbytes} of {out.nbytes} bytes)")
        return out

    def __getitem__(self, idx: int | np.integer | slice) -> Any:
        if isinstance(idx, (int, np.integer)) and not isinstance(idx, bool):
            i = int(idx)
            if i < 0:
                i += len(self)
            if not 0 <= i < len(self):
                raise IndexError(f"sequence {idx} out of range for {len(self)} sequences")
            seq = self._read(int(self.sequence_lengths[i]), int(self.sequence_pointers[i]) // self.index.dtype_size)
            if self.multimodal:
                return seq, self.sequence_modes[i]
            return seq
        if isinstance(idx, slice):
            start, stop, step = idx.indices(len(self))
            if step != 1:
                raise ValueError("slices into an IndexedDataset must be contiguous")
            lengths = self.sequence_lengths[start:stop]
            if stop <= start:
                flat = np.empty(0, dtype=self.index.dtype)
            else:
                flat = self._read(int(lengths.sum()), int(self.sequence_pointers[start]) // self.index.dtype_size)
            parts = np.split(flat, np.cumsum(lengths)[:-1]) if lengths.size else []
            if self.multimodal:
                return parts, self.sequence_modes[start:stop]
            return parts
        raise TypeError(f"unexpected index type {type(idx).__name__}")

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> Any:
        """Tokens `[offset, offset + length)` of sequence `idx` (to its end when length is None)."""
        i = int(idx)
        seq_len = int(self.sequence_lengths[i])
        if length is None:
            length = seq_len - offset
        if offset < 0 or length < 0 or offset + length > seq_len:
            raise IndexError(f"tokens [{offset}, {offset + length}) out of range for sequence {i} of length {seq_len}")
        seq = self._read(int(length), int(self.sequence_pointers[i]) // self.index.dtype_size + int(offset))
        if self.multimodal:
            return seq, self.sequence_modes[i]
        return seq

    @property
    def num_tokens(self) -> int:
        if getattr(self, "_num_tokens", None) is None:
            self._num_tokens = int(self.sequence_lengths.sum(dtype=np.int64))
        return self._num_tokens

    @property
    def num_documents(self) -> int:
        return int(self.document_indices.shape[0] - 1)

    def token_array(self) -> np.ndarray | None:
        """The whole `.bin` as one read-only array (None when not memory-mapped)."""
        return self._tokens

    def token_range(self, *, cache: bool = True) -> TokenRange | None:
        """Smallest and largest token id in the `.bin` (None when it holds no token): from
        `<prefix>.stats.json` when that still describes the files, else one scan of the `.bin`,
        then cached there when the directory is writable (and `cache`: a caller that must write
        nothing, e.g. a dry run, passes False)."""
        found, value = _read_stats(self.path_prefix)
        if found:
            return value
        lo = hi = None
        total = os.path.getsize(self._bin_path) // self.index.dtype_size
        for start in range(0, total, _SCAN_BLOCK):
            block = self._read(min(_SCAN_BLOCK, total - start), start)
            if block.size:
                b_lo, b_hi = block.min(), block.max()
                lo = b_lo if lo is None else min(lo, b_lo)
                hi = b_hi if hi is None else max(hi, b_hi)
        value = None if lo is None else TokenRange(int(lo), int(hi))
        if cache:
            _write_stats(self.path_prefix, value, self.num_tokens)
        return value


class IndexedDatasetBuilder:
    """Writes a `.bin`/`.idx` pair byte-identical to Megatron-Core's `IndexedDatasetBuilder`.

    Tokens go to a temporary file beside `bin_path`; `finalize(idx_path)` writes the index the
    same way, then renames both into place, so an interrupted build never leaves a half-written
    file where a good one was. An existing `bin_path` is refused unless `overwrite=True`.
    """

    def __init__(self, bin_path: str, dtype: Any = np.int32, multimodal: bool = False, *, overwrite: bool = False) -> None:
        self.bin_path = os.fspath(bin_path)
        self.dtype = np.dtype(dtype).type
        DType.code_from_dtype(self.dtype)  # unknown dtypes fail here, not at finalize
        if os.path.exists(self.bin_path) and not overwrite:
            raise FileExistsError(f"{self.bin_path}: exists; refusing to overwrite (pass overwrite=True)")
        self.multimodal = multimodal
        self.overwrite = overwrite
        self._tmp_bin = tmp_path_beside(self.bin_path)
        self.data_file = open(self._tmp_bin, "wb")
        self.sequence_lengths: array = array("q")
        self.document_indices: array = array("q", [0])
        self.sequence_modes: array | None = array("b") if multimodal else None
        if np.issubdtype(self.dtype, np.integer):
            info = np.iinfo(self.dtype)
            self._range: tuple[int, int] | None = (int(info.min), int(info.max))
        else:
            self._range = None
        self._seen: TokenRange | None = None  # the token range written so far (-> <prefix>.stats.json)

    def _note_range(self, lo: Any, hi: Any) -> None:
        lo, hi = int(lo), int(hi)
        seen = self._seen
        self._seen = TokenRange(lo, hi) if seen is None else TokenRange(min(seen.min, lo), max(seen.max, hi))

    def _as_array(self, tensor: Any) -> np.ndarray:
        arr = np.asarray(tensor.numpy() if hasattr(tensor, "numpy") and not isinstance(tensor, np.ndarray) else tensor)
        arr = arr.reshape(-1)
        if arr.size:
            lo, hi = arr.min(), arr.max()  # needed for the dtype check anyway: the range comes free
            if self._range is not None and (lo < self._range[0] or hi > self._range[1]):
                bad = lo if lo < self._range[0] else hi
                raise ValueError(f"token id {bad} does not fit the dataset dtype {np.dtype(self.dtype).name}")
            self._note_range(lo, hi)
        return np.asarray(arr, dtype=self.dtype)

    def add_item(self, tensor: Any, mode: int = 0) -> None:
        """Append one sequence (close the document with `end_document`)."""
        arr = self._as_array(tensor)
        self.data_file.write(arr.tobytes(order="C"))
        self.sequence_lengths.append(arr.size)
        if self.sequence_modes is not None:
            self.sequence_modes.append(mode)

    def add_document(self, tensor: Any, lengths: list[int], modes: list[int] | None = None) -> None:
        """Append one document made of `len(lengths)` sequences whose tokens are `tensor`."""
        arr = self._as_array(tensor)
        lengths = [int(v) for v in lengths]
        if sum(lengths) != arr.size or any(v < 0 for v in lengths):
            raise ValueError(f"document lengths {lengths} do not add up to its {arr.size} tokens")
        self.data_file.write(arr.tobytes(order="C"))
        self.sequence_lengths.extend(lengths)
        self.document_indices.append(len(self.sequence_lengths))
        if self.sequence_modes is not None:
            self.sequence_modes.extend(modes if modes is not None else [0] * len(lengths))

    def add_documents(self, tokens: Any, sequence_lengths: Any, sequences_per_document: Any) -> None:
        """Append many documents at once (an mf-data extension; same bytes as one add_document each).

        `tokens` is every token back to back, `sequence_lengths` the length of each sequence and
        `sequences_per_document` how many sequences each document has (0 for an empty document).
        """
        arr = self._as_array(tokens)
        lengths = np.asarray(sequence_lengths, dtype=np.int64).reshape(-1)
        per_doc = np.asarray(sequences_per_document, dtype=np.int64).reshape(-1)
        if int(lengths.sum()) != arr.size or (lengths.size and lengths.min() < 0):
            raise ValueError(f"sequence lengths add up to {int(lengths.sum())}, not the {arr.size} tokens given")
        if int(per_doc.sum()) != lengths.size or (per_doc.size and per_doc.min() < 0):
            raise ValueError(f"documents hold {int(per_doc.sum())} sequences, not the {lengths.size} given")
        self.data_file.write(arr.tobytes(order="C"))
        before = len(self.sequence_lengths)
        self.sequence_lengths.extend(lengths.tolist())
        self.document_indices.extend((before + np.cumsum(per_doc)).tolist())
        if self.sequence_modes is not None:
            self.sequence_modes.extend([0] * lengths.size)

    def end_document(self) -> None:
        self.document_indices.append(len(self.sequence_lengths))

    def add_index(self, path_prefix: str) -> None:
        """Append a whole existing dataset (same dtype) after what was added so far."""
        bin_path = get_bin_path(path_prefix)
        if not os.path.isfile(bin_path):
            raise DataFileNotFoundError(f"{bin_path}: not found")
        index = _IndexReader(get_idx_path(path_prefix), self.multimodal, os.path.getsize(bin_path))
        if index.dtype != self.dtype:
            raise DataFileError(
                f"{get_idx_path(path_prefix)}: dtype {np.dtype(index.dtype).name} differs from the "
                f"builder's {np.dtype(self.dtype).name}"
            )
        appended = IndexedDataset(path_prefix, self.multimodal).token_range()
        if appended is not None:
            self._note_range(*appended)
        offset = len(self.sequence_lengths)
        self.sequence_lengths.extend(index.sequence_lengths.tolist())
        self.document_indices.extend((offset + index.document_indices[1:]).tolist())
        if self.sequence_modes is not None and index.sequence_modes is not None:
            self.sequence_modes.extend(index.sequence_modes.tolist())
        del index
        with open(bin_path, "rb") as f:
            shutil.copyfileobj(f, self.data_file)

    def finalize(self, idx_path: str) -> None:
        """Write the index, then move both files into place."""
        idx_path = os.fspath(idx_path)
        if os.path.exists(idx_path) and not self.overwrite:
            self.abort()
            raise FileExistsError(f"{idx_path}: exists; refusing to overwrite (pass overwrite=True)")
        self.data_file.flush()
        os.fsync(self.data_file.fileno())
        self.data_file.close()
        lengths = np.frombuffer(self.sequence_lengths, dtype=np.int64) if len(self.sequence_lengths) else np.zeros(0, np.int64)
        if lengths.size and lengths.max() > np.iinfo(np.int32).max:
            self.abort()
            raise ValueError("a sequence longer than 2**31-1 tokens cannot be indexed")
        pointers = np.zeros(lengths.size, dtype=np.int64)
        if lengths.size > 1:
            np.cumsum(lengths[:-1] * np.dtype(self.dtype).itemsize, out=pointers[1:])
        tmp_idx = tmp_path_beside(idx_path)
        try:
            with open(tmp_idx, "wb") as f:
                f.write(_INDEX_HEADER)
                f.write(struct.pack("<Q", 1))
                f.write(struct.pack("<B", DType.code_from_dtype(self.dtype)))
                f.write(struct.pack("<Q", lengths.size))
                f.write(struct.pack("<Q", len(self.document_indices)))
                f.write(lengths.astype(np.int32).tobytes(order="C"))
                f.write(pointers.tobytes(order="C"))
                f.write(np.frombuffer(self.document_indices, dtype=np.int64).tobytes(order="C"))
                if self.sequence_modes is not None:
                    f.write(np.frombuffer(self.sequence_modes, dtype=np.int8).tobytes(order="C"))
                f.flush()
                os.fsync(f.fileno())
            os.replace(self._tmp_bin, self.bin_path)
            os.replace(tmp_idx, idx_path)
        except BaseException:
            for p in (tmp_idx, self._tmp_bin):
                if os.path.exists(p):
                    os.unlink(p)
            raise
        prefix = idx_path[: -len(".idx")] if idx_path.endswith(".idx") else None
        if prefix is not None and get_bin_path(prefix) == self.bin_path:  # a pair under one prefix
            _write_stats(prefix, self._seen, int(lengths.sum()))

    def abort(self) -> None:
        """Drop everything written so far; the target paths are left untouched."""
        if not self.data_file.closed:
            self.data_file.close()
        if os.path.exists(self._tmp_bin):
            os.unlink(self._tmp_bin)


def token_range(path_prefix: str, *, cache: bool = True) -> TokenRange | None:
    """Smallest and largest token id of the dataset at `path_prefix` (see IndexedDataset.token_range):
    what a trainer compares with its vocabulary before the first step. `cache=False` scans without
    writing `<prefix>.stats.json` when it is missing or stale."""
    return IndexedDataset(os.fspath(path_prefix)).token_range(cache=cache)
