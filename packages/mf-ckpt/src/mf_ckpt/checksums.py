"""Per-chunk checksums: CRC32C of each stored tensor's bytes, recorded in metadata.json.

Chosen by measurement on this machine class (one core, a 64 MiB float32 buffer): the `crc32c`
package 10.9 GB/s, xxhash's xxh3_64 10.4 GB/s, google-crc32c 8.0 GB/s (and it needs bytes, i.e.
a copy), xxh64 6.3 GB/s, zlib.crc32 2.3 GB/s. CRC32C is as fast as the fastest hash, is a standard
(iSCSI, ext4, gRPC, TensorStore) that other tools can recompute, takes any buffer without a copy and
releases the GIL on large ones, so ranks writing from threads checksum in parallel.

The saver computes it from the very bytes it writes (no second pass over the data); `verify` and
`load` recompute it from the bytes they read. In metadata.json, per tensor one checksum per chunk,
in the order of its chunk list:

    "checksums": {"algorithm": "crc32c", "model": {"<tensor>": ["<8 hex digits>", ...]}, "optimizer": {...}}

A checksum belongs to the chunk (tensor name and box), not to the file and key it is stored under:
metadata whose chunk points at another tensor's bytes fails the check even when those bytes are
intact.
"""

from __future__ import annotations

import re
from typing import Any

import crc32c as _crc32c
import numpy as np

from .errors import CheckpointError, brief

ALGORITHM = "crc32c"
_HEX = re.compile(r"[0-9a-f]{8}")


def update(value: int, data) -> int:
    """CRC32C of `data` (any contiguous buffer) continuing from `value` (0 to start)."""
    return _crc32c.crc32c(data, value)


def to_text(value: int) -> str:
    return f"{value:08x}"


def of_array(arr) -> int:
    """CRC32C of an array's bytes in C order (what the saver wrote for it)."""
    arr = np.ascontiguousarray(arr)
    return update(0, memoryview(arr.reshape(-1).view(np.uint8)))


def check(arr, expected: int, where: str) -> None:
    """Raise when `arr` (a whole stored tensor, as read) does not have the recorded checksum."""
    check_value(of_array(arr), expected, where)


def check_value(got: int, expected: int, where: str) -> None:
    """Raise when a computed checksum is not the recorded one."""
    if got != expected:
        raise CheckpointError(f"{where}: checksum mismatch (crc32c recorded {to_text(expected)}, read {to_text(got)}): "
                              "the file is damaged, or the metadata points this chunk at other data")


def parse(obj: Any, where: str) -> dict[str, dict[str, list[int]]]:
    """{part: {tensor: [checksum per chunk]}} from metadata.json's "checksums" entry (validated;
    parse_tensors checks that it covers every chunk)."""
    if not isinstance(obj, dict) or obj.get("algorithm") is None:
        raise CheckpointError(f"{where}: checksums must be an object with an 'algorithm'")
    if obj["algorithm"] != ALGORITHM:
        raise CheckpointError(f"{where}: checksums.algorithm {brief(obj['algorithm'])} is not one this mf-ckpt "
                              f"knows ({ALGORITHM})")
    out: dict[str, dict[str, list[int]]] = {}
    for part, tensors in obj.items():
        if part == "algorithm":
            continue
        if not isinstance(tensors, dict):
            raise CheckpointError(f"{where}: checksums.{brief(part)} must map tensor names to lists of checksums")
        out[part] = {}
        for name, values in tensors.items():
            if not (isinstance(values, list) and all(isinstance(v, str) and _HEX.fullmatch(v) for v in values)):
                raise CheckpointError(f"{where}: checksums.{part}[{brief(name)}]: expected a list of 8-hex-digit "
                                      f"checksums, got {brief(values)}")
            out[part][name] = [int(v, 16) for v in values]
    return out


def for_layout(metadata: dict[str, Any], written: dict[str, dict[str, int]]) -> dict[str, Any]:
    """The "checksums" entry of `metadata` (a parsed metadata.json without one) from what the
    ranks wrote ({file: {key: crc}})."""
    out: dict[str, Any] = {"algorithm": ALGORITHM}
    for part in ("model", "optimizer"):
        if part not in metadata:
            continue
        out[part] = {}
        for name, tensor in metadata[part].items():
            values = []
            for chunk in tensor["chunks"]:
                value = written.get(chunk["file"], {}).get(chunk["key"])
                if value is None:
                    raise AssertionError(f"no checksum was computed for {chunk['file']}:{chunk['key']}")
                values.append(to_text(value))
            out[part][name] = values
    return out
