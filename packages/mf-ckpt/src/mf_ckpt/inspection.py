"""`describe` (what `mf-ckpt inspect` prints) and `verify` (read every chunk back).

A Hugging Face directory is described by its own tensor names (as transformers and the files
name them), each with the mf tensor it becomes; the other kinds by their mf names.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from . import assets, dtypes, jsonable
from .errors import CheckpointError
from .extract import read_region
from .fsutil import safe_member
from .layout import CheckpointLayout
from .progress import Progress
from .sources import open_source, validate_files
from .st_io import ReaderPool

_LAYER = re.compile(r"layers\.(\d+)\.")


def stored_tensors(path, iteration: int | None = None, part: str = "model") -> dict[str, tuple[str, tuple[int, ...]]]:
    """{mf name: (dtype, shape)} of one part of a checkpoint, from its metadata (or an HF
    directory's headers) alone: no tensor data is read."""
    layout = open_source(path, iteration)
    if part not in layout.parts:
        raise CheckpointError(f"{layout.root}: holds no {part} tensors")
    return {name: (t.dtype, t.shape) for name, t in layout.parts[part].items()}


def check_config_shapes(hf_config, stored: dict[str, tuple[str, tuple[int, ...]]], where: str,
                        config_name: str = "config.json") -> bool:
    """Check stored tensor shapes against what an HF config implies, before anything is built from
    the config (a crafted `hidden_size` must not cost memory first). One CheckpointError line
    naming the tensor and both shapes. False (nothing checked) for a model_type mf-ckpt has no
    rules for."""
    from .hf.convert import ARCHITECTURES, plan_for
    from .hf.rules import check_mf

    if not isinstance(hf_config, dict) or hf_config.get("model_type") not in ARCHITECTURES:
        return False
    # The layer count first: the plan of a config claiming 10**5 layers is not worth building.
    layers = {int(m.group(1)) for name in stored if (m := _LAYER.match(name))}
    claimed = hf_config.get("num_hidden_layers")
    if type(claimed) is int and layers and claimed != len(layers):
        raise CheckpointError(f"{where}: {config_name} has num_hidden_layers {claimed}, the checkpoint holds "
                              f"{len(layers)} layers")
    check_mf(plan_for(hf_config, mf_names=stored), stored, where, config_name)
    return True


def describe(path, iteration: int | None = None) -> dict[str, Any]:
    """A JSON-able summary: source kind, iteration, common state, tensors, files and sizes."""
    layout = open_source(path, iteration)
    return summarize(layout)


def _hf_tensors(layout: CheckpointLayout) -> dict[str, dict[str, Any]]:
    """{HF name: dtype, shape, bytes, file, and the mf tensor(s) it becomes (None: skipped)} of an HF
    directory, in file order."""
    mf_of: dict[str, list[str]] = {}
    for name, meta in layout.parts["model"].items():
        for chunk in meta.chunks:
            mf_of.setdefault(chunk.key, [])
            if name not in mf_of[chunk.key]:
                mf_of[chunk.key].append(name)
    out = {}
    for path, header in layout.info.get("headers", {}).items():
        for key, info in sorted(header.tensors.items(), key=lambda kv: kv[1].start):
            mf = mf_of.get(key)
            out[key] = {"dtype": info.dtype, "shape": list(info.shape), "chunks": 1, "bytes": info.nbytes,
                        "file": path.name, "mf": ", ".join(mf) if mf else None}
    return out


def summarize(layout: CheckpointLayout) -> dict[str, Any]:
    parts = {}
    for part, tensors in layout.parts.items():
        parts[part] = {
            name: {"dtype": t.dtype, "shape": list(t.shape), "chunks": len(t.chunks), "bytes": t.nbytes}
            for name, t in tensors.items()
        }
    if layout.kind == "hf":
        parts["model"] = _hf_tensors(layout)
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
        "assets": {name: {"bytes": r.nbytes, "crc32c": f"{r.crc32c:08x}"}
                   for name, r in sorted(layout.info.get("assets", {}).items())},
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
    records = layout.info.get("assets", {})
    for record in records.values():
        assets.read(layout.root, record)
    tensors = sum(len(p) for p in layout.parts.values())
    return {"path": str(Path(layout.root)), "kind": layout.kind, "tensors": tensors, "chunks": chunks, "bytes": total,
            "checksums_verified": checked, "assets": sorted(records)}
