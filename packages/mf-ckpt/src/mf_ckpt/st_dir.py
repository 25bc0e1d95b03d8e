"""A directory of whole tensors in safetensors: `{base}.safetensors`, or shards plus
`{base}.safetensors.index.json` (the Hugging Face layout, also used by `mf-ckpt merge`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from .errors import CheckpointError
from .fsutil import read_json, safe_member
from .st_io import Entry, FileHeader, read_header, write_file


def index_name(base: str) -> str:
    return f"{base}.safetensors.index.json"


def single_name(base: str) -> str:
    return f"{base}.safetensors"


def has_tensors(root: Path, base: str) -> bool:
    return (root / index_name(base)).is_file() or (root / single_name(base)).is_file()


def tensor_locations(root: Path, base: str = "model") -> tuple[dict[str, Path], dict[Path, FileHeader]]:
    """Tensor name -> file, from the index if there is one, else `{base}.safetensors`."""
    index_path = root / index_name(base)
    headers: dict[Path, FileHeader] = {}
    if index_path.is_file():
        index = read_json(index_path, index_path.name)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index_path}: missing 'weight_map' object")
        locations = {}
        for name, file in weight_map.items():
            path = safe_member(root, file, "shard file name")
            if path not in headers:
                if not path.is_file():
                    raise CheckpointError(f"{index_path}: shard {file!r} listed for {name!r} does not exist")
                headers[path] = read_header(path)
            if name not in headers[path].tensors:
                raise CheckpointError(f"{index_path}: tensor {name!r} is not in its shard {file!r}")
            locations[name] = path
        for path, header in headers.items():
            stray = [n for n in header.tensors if locations.get(n) != path]
            if stray:
                raise CheckpointError(f"{path}: tensor {stray[0]!r} is not listed in {index_path.name}")
        return locations, headers
    path = safe_member(root, single_name(base))
    if not path.is_file():
        raise CheckpointError(f"{root}: no {single_name(base)} or {index_name(base)}")
    headers[path] = read_header(path)
    return {name: path for name in headers[path].tensors}, headers


def shard_groups(entries: list[Entry], max_shard_size: int | None) -> list[list[Entry]]:
    """Greedy split in order; a tensor larger than the limit gets a shard of its own."""
    if max_shard_size is None:
        return [entries]
    groups: list[list[Entry]] = [[]]
    size = 0
    for e in entries:
        if groups[-1] and size + e.nbytes > max_shard_size:
            groups.append([])
            size = 0
        groups[-1].append(e)
        size += e.nbytes
    return groups


def write_tensors(
    out: Path,
    entries: list[Entry],
    base: str = "model",
    max_shard_size: int | None = None,
    metadata: dict[str, str] | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> list[str]:
    """Write `entries` as one file or as `{base}-0000k-of-0000n.safetensors` shards + index."""
    groups = shard_groups(entries, max_shard_size)
    if len(groups) == 1:
        write_file(out / single_name(base), groups[0], metadata, on_bytes=on_bytes)
        return [single_name(base)]
    weight_map = {}
    files = []
    for k, group in enumerate(groups, 1):
        file = f"{base}-{k:05d}-of-{len(groups):05d}.safetensors"
        write_file(out / file, group, metadata, on_bytes=on_bytes)
        weight_map.update({e.name: file for e in group})
        files.append(file)
    total = sum(e.nbytes for e in entries)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / index_name(base)).write_text(json.dumps(index, indent=2) + "\n")
    return files
