"""Open anything `load` accepts and describe it as a CheckpointLayout, validating it fully.

Sources: an mf save directory (its marker picks the iteration), one mf iteration directory, a
Hugging Face directory (converted on the fly through the architecture's plan: loading needs no
offline conversion step), or a directory of whole mf-named tensors as `mf-ckpt merge` writes it.
`validate_files` then checks every file a load will read: present, inside the directory, header
intact, key present, dtype and shape as the metadata says.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from . import assets, checksums, jsonable
from .ckpt_dir import COMMON, FORMAT, FORMAT_VERSION, MARKER, METADATA, committed_dirs, resolve
from .errors import CheckpointError, brief
from .fsutil import loads_json, read_json, safe_member
from .hf.convert import warn_skipped
from .hf.io import is_hf_dir, open_hf_dir
from .layout import PARTS, CheckpointLayout, Chunk, TensorMeta, parse_tensors
from .st_dir import has_tensors, tensor_locations
from .st_io import FileHeader, read_header
from .tokenizer_files import CarriedTokenizer, tokenizer_of

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


_PARSED: OrderedDict[tuple, tuple[dict, dict]] = OrderedDict()
_PARSED_LOCK = threading.Lock()


def find_tokenizer(path: str | os.PathLike, iteration: int | None = None) -> CarriedTokenizer | None:
    """The tokenizer a checkpoint directory (any kind `load` accepts) carries, or None
    (tokenizer_files.py reads it from the opened source)."""
    return tokenizer_of(open_source(path, iteration))


def _parse_metadata(path: Path) -> tuple[dict, dict[str, dict[str, TensorMeta]]]:
    """(raw metadata, validated parts) of a metadata.json, memoised by content digest.

    Validating every chunk is the costly part of opening a large checkpoint; ranks that share a
    process (the threaded simulator, tools loading model then optimizer) do it once. Keyed by a
    digest of the bytes, so a rewritten file is always parsed again.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: {METADATA} not found") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read {METADATA} ({e.strerror or e})") from None
    key = hashlib.blake2b(raw, digest_size=20).digest()
    with _PARSED_LOCK:  # concurrent ranks wait for the first parse instead of repeating it
        if key in _PARSED:
            _PARSED.move_to_end(key)
            return _PARSED[key]
        where = str(path)
        meta = loads_json(raw, where, METADATA)
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise CheckpointError(f"{where}: not an mf-ckpt metadata file")
        version = meta.get("format_version")
        if type(version) is not int or version < 1:
            raise CheckpointError(f"{where}: format_version must be a positive integer, got {brief(version)}")
        if version > FORMAT_VERSION:
            raise CheckpointError(f"{where}: format_version {version} is newer than this mf-ckpt")
        world = meta.get("world_size")
        if world is not None and (type(world) is not int or world < 1):
            raise CheckpointError(f"{where}: world_size must be a positive integer, got {brief(world)}")
        files = meta.get("files", [])
        if type(files) is not list or not all(type(f) is str for f in files):
            raise CheckpointError(f"{where}: files must be a list of file names, got {brief(files)}")
        sums = checksums.parse(meta["checksums"], where) if "checksums" in meta else None
        if assets.KEY in meta:
            assets.parse(meta[assets.KEY], where)
        parts = {p: parse_tensors(meta[p], f"{where} [{p}]", None if sums is None else sums.get(p, {}))
                 for p in PARTS if p in meta}
        if "model" not in parts:
            raise CheckpointError(f"{where}: no model tensors")
        _PARSED[key] = (meta, parts)
        while len(_PARSED) > 8:
            _PARSED.popitem(last=False)
        return meta, parts


def _common_json(path: Path) -> tuple[dict, Any, Any, dict]:
    """(common, per_rank, iteration, raw) of a common.json, every field checked (one line naming it)."""
    info = read_json(path, COMMON)
    if not isinstance(info, dict):
        raise CheckpointError(f"{path}: must be a JSON object")
    common = info.get("common", {})
    if not isinstance(common, dict):
        raise CheckpointError(f"{path}: 'common' must be an object, got {type(common).__name__}")
    common = jsonable.decode(common, "common", str(path))
    per_rank = info.get("per_rank")
    if per_rank is not None:
        if not isinstance(per_rank, list):
            raise CheckpointError(f"{path}: 'per_rank' must be a list (one entry per rank), got {type(per_rank).__name__}")
        per_rank = jsonable.decode(per_rank, "per_rank", str(path))
    iteration = info.get("iteration")
    if iteration is not None and (type(iteration) is not int or iteration < 0):
        raise CheckpointError(f"{path}: 'iteration' must be a non-negative integer, got {brief(iteration)}")
    return common, per_rank, iteration, info


def open_mf(path: Path, iteration: int | None = None) -> CheckpointLayout:
    directory, iteration = resolve(path, iteration)
    meta, parts = _parse_metadata(directory / METADATA)
    common, per_rank, _, info = _common_json(directory / COMMON)
    world = meta.get("world_size")
    carried = assets.parse(meta.get(assets.KEY, {}), str(directory / METADATA))
    return CheckpointLayout("mf", directory, parts, iteration, common, per_rank, world,
                            {"metadata": meta, "common.json": info, "assets": carried})


def open_hf(path: Path) -> CheckpointLayout:
    hf = open_hf_dir(path)
    warn_skipped(hf.skipped, str(path))
    tensors = {}
    for name, target in hf.plan.targets.items():
        code = hf.info(target.pieces[0].hf).dtype
        chunks = [
            Chunk(p.offset, p.shape, hf.locations[p.hf].name, p.hf, p.hf_start, p.squeeze, transpose=p.transpose)
            for p in target.pieces
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
    common, per_rank, iteration, carried = {}, None, None, {}
    if (path / COMMON).is_file():
        common, _, iteration, raw = _common_json(path / COMMON)
        carried = assets.parse(raw.get(assets.KEY, {}), str(path / COMMON))
    return CheckpointLayout("safetensors", path, parts, iteration, common, per_rank, None,
                            {"headers": headers, "assets": carried})


def validate_files(layout: CheckpointLayout, needed=None) -> dict[Path, FileHeader]:
    """Check chunks against their files: all of them, or `needed`, a set of (part, name) for whole
    tensors or (part, name, chunk index) for the chunks one rank will read."""
    headers: dict[Path, FileHeader] = dict(layout.info.get("headers", {}))
    paths: dict[str, Path] = {}  # resolving a name (realpath) is costly: once per file
    if needed is None:
        needed = {(part, name) for part, tensors in layout.parts.items() for name in tensors}
    for item in sorted(needed):
        part, name = item[0], item[1]
        meta = layout.parts[part][name]
        for chunk in meta.chunks if len(item) == 2 else [meta.chunks[item[2]]]:
            path = paths.get(chunk.file)
            if path is None:
                path = paths[chunk.file] = safe_member(layout.root, chunk.file)
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
