"""Open anything `load` accepts and describe it as a CheckpointLayout, validating it fully.

Sources: an mf save directory (its marker picks the iteration), one mf iteration directory, a
Hugging Face directory (converted on the fly through the architecture's plan: loading needs no
offline conversion step), or a directory of whole mf-named tensors as `mf-ckpt merge` writes it.
`validate_files` then checks every file a load will read: present, inside the directory, header
intact, key present, dtype and shape as the metadata says.
"""

from __future__ import annotations

from pathlib import Path

from . import jsonable
from .ckpt_dir import COMMON, FORMAT, FORMAT_VERSION, MARKER, METADATA, committed_dirs, resolve
from .errors import CheckpointError
from .fsutil import read_json, safe_member
from .hf.convert import warn_skipped
from .hf.io import is_hf_dir, open_hf_dir
from .layout import PARTS, CheckpointLayout, Chunk, TensorMeta, parse_tensors
from .st_dir import has_tensors, tensor_locations
from .st_io import FileHeader, read_header

MERGED_BASES = {"model": "model", "optimizer": "optimizer"}


def open_source(path, iteration: int | None = None) -> CheckpointLayout:
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: checkpoint directory does not exist")
    if (path / MARKER).is_file() or (path / METADATA).is_file() or (iteration is not None and committed_dirs(path)):
        return open_mf(path, iteration)
    if iteration is not None:
        raise CheckpointError(f"{path}: iteration={iteration} given, but this is not an mf save directory")
    if is_hf_dir(path):
        return open_hf(path)
    if has_tensors(path, "model"):
        return open_merged(path)
    if committed_dirs(path):
        raise CheckpointError(f"{path}: has iteration directories but no {MARKER} (no committed checkpoint)")
    raise CheckpointError(
        f"{path}: not a checkpoint (no {MARKER}, {METADATA}, config.json + model.safetensors, or model.safetensors)"
    )


def open_mf(path: Path, iteration: int | None = None) -> CheckpointLayout:
    directory, iteration = resolve(path, iteration)
    meta = read_json(directory / METADATA, METADATA)
    where = str(directory / METADATA)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{where}: not an mf-ckpt metadata file")
    if not isinstance(meta.get("format_version"), int) or meta["format_version"] > FORMAT_VERSION:
        raise CheckpointError(f"{where}: format_version {meta.get('format_version')!r} is newer than this mf-ckpt")
    parts = {p: parse_tensors(meta[p], f"{where} [{p}]") for p in PARTS if p in meta}
    if "model" not in parts:
        raise CheckpointError(f"{where}: no model tensors")
    info = read_json(directory / COMMON, COMMON)
    if not isinstance(info, dict):
        raise CheckpointError(f"{directory / COMMON}: must be a JSON object")
    common = jsonable.decode(info.get("common", {}))
    per_rank = jsonable.decode(info["per_rank"]) if "per_rank" in info else None
    world = meta.get("world_size")
    return CheckpointLayout("mf", directory, parts, iteration, common, per_rank, world,
                            {"metadata": meta, "common.json": info})


def open_hf(path: Path) -> CheckpointLayout:
    hf = open_hf_dir(path)
    warn_skipped(hf.skipped, str(path))
    tensors = {}
    for name, target in hf.plan.targets.items():
        code = hf.info(target.pieces[0].hf).dtype
        chunks = [
            Chunk(p.offset, p.shape, hf.locations[p.hf].name, p.hf, p.hf_start, p.squeeze) for p in target.pieces
        ]
        tensors[name] = TensorMeta(code, target.shape, chunks)
    common = {"hf_config": hf.config}
    generation = path / "generation_config.json"
    if generation.is_file():
        common["hf_generation_config"] = read_json(generation, "generation_config.json")
    return CheckpointLayout("hf", path, {"model": tensors}, None, common, None, None,
                            {"headers": hf.headers, "skipped": hf.skipped})


def open_merged(path: Path) -> CheckpointLayout:
    parts, headers = {}, {}
    for part, base in MERGED_BASES.items():
        if not has_tensors(path, base):
            continue
        locations, part_headers = tensor_locations(path, base)
        headers.update(part_headers)
        parts[part] = {
            name: TensorMeta(info.dtype, info.shape, [Chunk((0,) * len(info.shape), info.shape, file.name, name)])
            for name, file in locations.items()
            for info in [part_headers[file].tensors[name]]
        }
    common, per_rank, iteration = {}, None, None
    if (path / COMMON).is_file():
        info = read_json(path / COMMON, COMMON)
        if isinstance(info, dict):
            common = jsonable.decode(info.get("common", {}))
            iteration = info.get("iteration")
    return CheckpointLayout("safetensors", path, parts, iteration, common, per_rank, None, {"headers": headers})


def validate_files(layout: CheckpointLayout, needed: dict[str, set[str]] | None = None) -> dict[Path, FileHeader]:
    """Check every chunk of the `needed` tensors ({part: names}; all when None) against its file."""
    headers: dict[Path, FileHeader] = dict(layout.info.get("headers", {}))
    for part, tensors in layout.parts.items():
        names = tensors.keys() if needed is None else needed.get(part, ())
        for name in names:
            meta = tensors[name]
            for chunk in meta.chunks:
                path = safe_member(layout.root, chunk.file)
                header = headers.get(path)
                if header is None:
                    if not path.is_file():
                        raise CheckpointError(f"{layout.root}: file {chunk.file!r} (holding {part} tensor {name!r}) is missing")
                    header = headers[path] = read_header(path)
                info = header.tensors.get(chunk.key)
                if info is None:
                    raise CheckpointError(f"{path}: has no tensor {chunk.key!r} ({part} tensor {name!r})")
                if info.dtype != meta.dtype:
                    raise CheckpointError(f"{path}: tensor {chunk.key!r} is {info.dtype}, metadata says {meta.dtype}")
                start, stop = chunk.stored_region(chunk.offset, chunk.shape)
                stored = chunk.stored_shape()
                fits = len(start) == len(info.shape) and all(b <= n for b, n in zip(stop, info.shape))
                exact = chunk.src_start is not None or tuple(info.shape) == stored
                if not (fits and exact):
                    raise CheckpointError(
                        f"{path}: tensor {chunk.key!r} has shape {list(info.shape)}, metadata says {list(stored)}"
                    )
    return headers
