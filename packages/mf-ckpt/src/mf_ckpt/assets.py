"""Files a checkpoint carries beside its tensors (its tokenizer), written with it and checksummed.

An asset is a small file under a two-part relative name inside the checkpoint directory, e.g.
`tokenizer/tokenizer.model`: the top level of an iteration directory stays mf-ckpt's own
(metadata.json, common.json, shard files). Rank 0 writes the assets into the staging directory at
the commit, before metadata.json, so they are renamed into place with the checkpoint: a crash at
any instant leaves the previous checkpoint whole, and rotation deletes them with their iteration.
Each iteration holds its own copy (a few MB at most for a tokenizer, next to the weights), so one
copied `iteration_N` directory still stands on its own. metadata.json records size and CRC32C:

    "assets": {"tokenizer/tokenizer.model": {"bytes": 272711, "crc32c": "1a2b3c4d"}}

A merged directory (`mf-ckpt merge`) records the same entry in its common.json.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import checksums
from .errors import CheckpointError, brief
from .fsutil import fsync_dir, safe_member

KEY = "assets"
_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}")
_HEX = re.compile(r"[0-9a-f]{8}")


@dataclass(frozen=True)
class Record:
    """What metadata.json says about one asset."""

    name: str
    nbytes: int
    crc32c: int

    def to_json(self) -> dict[str, Any]:
        return {"bytes": self.nbytes, "crc32c": checksums.to_text(self.crc32c)}


def check_name(name: Any, where: str = "assets") -> str:
    """`dir/file`, both plain names (no hidden files, separators or `..`)."""
    parts = name.split("/") if isinstance(name, str) else []
    if len(parts) != 2 or not all(_PART.fullmatch(p) for p in parts):
        raise CheckpointError(f"{where}: asset name {brief(name)} must be 'directory/file' (plain names, e.g. "
                              "'tokenizer/tokenizer.model')")
    return name


def prepare(assets: Mapping[str, Any] | None, where: str = "assets") -> dict[str, bytes]:
    """{name: bytes}: names checked, file paths read now (a later change to the source file does not
    reach a checkpoint being written asynchronously)."""
    out: dict[str, bytes] = {}
    for name, value in (assets or {}).items():
        check_name(name, where)
        if isinstance(value, (bytes, bytearray, memoryview)):
            out[name] = bytes(value)
            continue
        if not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"asset {name!r}: expected bytes or a file path, got {type(value).__name__}")
        try:
            with open(value, "rb") as f:
                out[name] = f.read()
        except OSError as e:
            raise CheckpointError(f"{value}: cannot read asset {name!r} ({e.strerror or e})") from None
    return out


def write(directory: Path, assets: Mapping[str, bytes], *, fsync: bool = False) -> dict[str, Record]:
    """Write prepared assets under `directory`; their records."""
    records = {}
    for name, data in sorted(assets.items()):
        path = Path(directory) / name
        path.parent.mkdir(exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        records[name] = Record(name, len(data), checksums.update(0, data))
    if fsync:
        for sub in {Path(directory) / n.split("/")[0] for n in assets}:
            fsync_dir(sub)
    return records


def to_json(records: Mapping[str, Record]) -> dict[str, Any]:
    return {name: r.to_json() for name, r in sorted(records.items())}


def parse(obj: Any, where: str) -> dict[str, Record]:
    """Validated records of a metadata.json / common.json "assets" entry."""
    if not isinstance(obj, dict):
        raise CheckpointError(f"{where}: assets must be an object mapping names to {{bytes, crc32c}}, got {brief(obj)}")
    out = {}
    for name, entry in obj.items():
        check_name(name, where)
        nbytes = entry.get("bytes") if isinstance(entry, dict) else None
        crc = entry.get("crc32c") if isinstance(entry, dict) else None
        if type(nbytes) is not int or nbytes < 0 or not (isinstance(crc, str) and _HEX.fullmatch(crc)):
            raise CheckpointError(f"{where}: assets[{brief(name)}] must be {{\"bytes\": int >= 0, \"crc32c\": "
                                  f"8 hex digits}}, got {brief(entry)}")
        out[name] = Record(name, nbytes, int(crc, 16))
    return out


def read(root: Path, record: Record) -> bytes:
    """An asset's bytes, checked against its record (size and CRC32C)."""
    directory, file = record.name.split("/")
    path = safe_member(safe_member(root, directory, "asset directory"), file, "asset file")
    try:
        with open(path, "rb") as f:
            data = f.read(record.nbytes + 1)
    except FileNotFoundError:
        raise CheckpointError(f"{root}: asset {record.name!r} listed in the metadata is missing") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read asset ({e.strerror or e})") from None
    if len(data) != record.nbytes:
        size = f"more than {record.nbytes}" if len(data) > record.nbytes else str(len(data))
        raise CheckpointError(f"{path}: asset is {size} bytes, the metadata says {record.nbytes}")
    got = checksums.update(0, data)
    if got != record.crc32c:
        raise CheckpointError(f"{path}: asset checksum mismatch (crc32c recorded {checksums.to_text(record.crc32c)}, "
                              f"read {checksums.to_text(got)}): the file is damaged or was replaced")
    return data


def in_directory(records: Mapping[str, Record], directory: str) -> dict[str, Record]:
    """{file name: record} of the assets under `directory/`."""
    return {name.split("/", 1)[1]: r for name, r in records.items() if name.split("/", 1)[0] == directory}
