"""`describe` (what `mf-ckpt inspect` prints) and `verify` (read every chunk back)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from . import dtypes, jsonable
from .errors import CheckpointError
from .extract import read_region
from .fsutil import safe_member
from .layout import CheckpointLayout
from .progress import Progress
from .sources import open_source, validate_files
from .st_io import ReaderPool


def describe(path, iteration: int | None = None) -> dict[str, Any]:
    """A JSON-able summary: source kind, iteration, common state, tensors, files and sizes."""
    layout = open_source(path, iteration)
    return summarize(layout)


def summarize(layout: CheckpointLayout) -> dict[str, Any]:
    parts = {}
    for part, tensors in layout.parts.items():
        parts[part] = {
            name: {"dtype": t.dtype, "shape": list(t.shape), "chunks": len(t.chunks), "bytes": t.nbytes}
            for name, t in tensors.items()
        }
    files = {}
    for name in sorted(layout.files() | set(layout.info.get("metadata", {}).get("files", []))):
        try:
            files[name] = safe_member(layout.root, name).stat().st_size
        except (OSError, CheckpointError):
            files[name] = None  # reported missing by verify
    return {
        "kind": layout.kind,
        "path": str(layout.root),
        "iteration": layout.iteration,
        "world_size": layout.world_size,
        "common": jsonable.encode(layout.common),
        "parts": parts,
        "tensor_bytes": {part: sum(t["bytes"] for t in ts.values()) for part, ts in parts.items()},
        "files": files,
        "file_bytes": sum(s for s in files.values() if s is not None),
    }


def verify(path, iteration: int | None = None, *, progress: bool = False) -> dict[str, Any]:
    """Validate metadata against every file, read every chunk back and check it against its
    recorded checksum; raises CheckpointError. `checksums_verified` < `chunks` in the result means
    some chunks carry none (a checkpoint written before mf-ckpt 0.3, an HF or merged directory)."""
    layout = open_source(path, iteration)
    for name in layout.info.get("metadata", {}).get("files", []):
        file = safe_member(layout.root, name)
        if not file.is_file():
            raise CheckpointError(f"{layout.root}: file {name!r} listed in metadata.json is missing")
    headers = validate_files(layout)
    total = sum(t.nbytes for part in layout.parts.values() for t in part.values())
    chunks = checked = 0
    with ReaderPool(headers) as pool, Progress(total, "verify", enabled=progress) as bar:
        for part, tensors in layout.parts.items():
            for name, meta in tensors.items():
                for chunk in meta.chunks:
                    read_region(pool, layout, part, name, chunk, chunk.offset, chunk.shape, verify=True)
                    bar.update(math.prod(chunk.shape) * dtypes.itemsize(meta.dtype))
                    chunks += 1
                    checked += chunk.checksum is not None
    tensors = sum(len(p) for p in layout.parts.values())
    return {"path": str(Path(layout.root)), "kind": layout.kind, "tensors": tensors, "chunks": chunks, "bytes": total,
            "checksums_verified": checked}
