"""Hugging Face directories: config.json + model.safetensors or a sharded index.

`load_hf_state` reads only the regions the plan needs (experts go straight into their stacked
buffer); `save_hf` writes transformers' layout (`model.safetensors`, or
`model-0000k-of-0000n.safetensors` + `model.safetensors.index.json` when `max_shard_size` is set
and exceeded) into a temp directory renamed into place, so a failure never leaves half a model.
Beside the weights go config.json (mf-only keys left out, `architectures` and `dtype` filled in
when missing), generation_config.json and the tokenizer's files, so transformers'
`AutoModelForCausalLM`, `AutoTokenizer` and `generate` work on the directory as saved.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import dtypes
from ..errors import CheckpointError
from ..fsutil import atomic_output_dir, read_json
from ..progress import Progress
from ..st_dir import has_tensors, tensor_locations, write_tensors
from ..st_io import Entry, FileHeader, ReaderPool
from ..tokenizer_files import hf_export_files, write_files
from ..units import parse_size
from .convert import ARCHITECTURES, assemble, mf_to_hf, plan_for, warn_skipped
from .rules import Plan, check_hf


@dataclass
class HFDirectory:
    """A validated HF directory: its config, plan, and where each HF tensor lives."""

    root: Path
    config: dict[str, Any]
    plan: Plan
    locations: dict[str, Path]  # HF tensor name -> file
    headers: dict[Path, FileHeader]
    skipped: list[str]

    def info(self, hf_name: str):
        return self.headers[self.locations[hf_name]].tensors[hf_name]


def is_hf_dir(path: Path) -> bool:
    path = Path(path)
    return (path / "config.json").is_file() and has_tensors(path, "model")


def read_config(hf_dir: str | Path) -> dict[str, Any]:
    config = read_json(Path(hf_dir) / "config.json", "config.json")
    if not isinstance(config, dict):
        raise CheckpointError(f"{hf_dir}/config.json: must be a JSON object")
    return config


def open_hf_dir(hf_dir: str | Path) -> HFDirectory:
    """Read config.json and every shard header, and check them against the architecture's rules."""
    root = Path(hf_dir)
    if not root.is_dir():
        raise CheckpointError(f"{root}: not a directory")
    config = read_config(root)
    locations, headers = tensor_locations(root)
    plan = plan_for(config, locations.keys())
    found = {}
    for name, path in locations.items():
        info = headers[path].tensors[name]
        found[name] = (info.dtype, info.shape)
    skipped = check_hf(plan, found, str(root))
    return HFDirectory(root, config, plan, locations, headers, skipped)


def load_hf_state(hf_dir: str | Path, dtype=None, *, progress: bool = False) -> tuple[dict, dict[str, np.ndarray]]:
    """(config.json dict, mf-named state) of an HF directory.

    `dtype` (e.g. "float32") converts floating tensors on the way, BF16 included; by default
    tensors keep their stored dtype (BF16 as mf-ckpt's raw BF16 dtype, see `mf_ckpt.dtypes`).
    """
    hf = open_hf_dir(hf_dir)
    warn_skipped(hf.skipped, str(hf.root))
    target_code = dtypes.code_of(np.dtype(dtype)) if dtype is not None else None
    state: dict[str, np.ndarray] = {}
    total = sum(hf.info(p.hf).nbytes for t in hf.plan.targets.values() for p in t.pieces)
    with ReaderPool(hf.headers) as pool, Progress(total, "read", enabled=progress) as bar:

        def read_piece(p):
            reader = pool.get(hf.locations[p.hf])
            region = reader.read(p.hf, p.hf_start, p.hf_stop)
            bar.update(region.nbytes)
            return region

        for name, target in hf.plan.targets.items():
            arr = assemble(target, read_piece)
            if target_code is not None and dtypes.is_floating(dtypes.code_of(arr.dtype)):
                arr = dtypes.cast(arr, target_code)
            state[name] = arr
    return hf.config, state


# Keys of the mf model section that mean nothing to transformers (mf-models' extras).
MF_ONLY_KEYS = ("seq_length", "compute_dtype", "params_dtype", "use_flash_attention")
_TORCH_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}


def export_config(hf_config: Mapping[str, Any], entries: list[Entry]) -> dict[str, Any]:
    """config.json of an export: the carried config without mf-only keys, with `architectures`
    (transformers' class) and `dtype` (of the stored weights) when it has none."""
    config = {k: v for k, v in hf_config.items() if k not in MF_ONLY_KEYS}
    arch = ARCHITECTURES.get(config.get("model_type"))
    if isinstance(config.get("architectures"), str):
        config["architectures"] = [config["architectures"]]
    if config.get("architectures") is None and arch is not None and arch.hf_class:
        config["architectures"] = [arch.hf_class]
    stored = next((_TORCH_DTYPES[e.dtype] for e in entries if e.dtype in _TORCH_DTYPES), None)
    if config.get("dtype") is None and config.get("torch_dtype") is None and stored is not None:
        config["dtype"] = stored
    return config


def write_json(path: Path, obj: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(dict(obj), indent=2, sort_keys=True) + "\n")


def write_hf_files(
    out: Path,
    entries: list[Entry],
    hf_config: Mapping[str, Any],
    max_shard_size: int | str | None = None,
    *,
    generation_config: Mapping[str, Any] | None = None,
    tokenizer: Mapping[str, bytes] | None = None,
    progress: bool = False,
    source: str = "the checkpoint",
) -> None:
    """Write config.json, the safetensors shards (+ index) of `entries`, generation_config.json
    and the tokenizer's files ({name: bytes}) into the existing directory `out` (`source`: the
    directory the tokenizer came from, for error messages)."""
    limit = parse_size(max_shard_size) if max_shard_size is not None else None
    # the tokenizer first: a tokenizer that cannot be exported fails before gigabytes are written
    tokenizer_files = hf_export_files(tokenizer, hf_config, source) if tokenizer else {}
    total = sum(e.nbytes for e in entries)
    with Progress(total, "write", enabled=progress) as bar:
        write_tensors(out, entries, "model", limit, {"format": "pt"}, on_bytes=bar.update)
    write_json(out / "config.json", export_config(hf_config, entries))
    if generation_config is not None:
        write_json(out / "generation_config.json", generation_config)
    if tokenizer_files:
        write_files(out, tokenizer_files)


def save_hf(
    out_dir: str | Path,
    mf_state: Mapping[str, np.ndarray],
    hf_config: Mapping[str, Any],
    max_shard_size: int | str | None = None,
    *,
    generation_config: Mapping[str, Any] | None = None,
    tokenizer: Mapping[str, bytes] | None = None,
    overwrite: bool = False,
    progress: bool = False,
) -> Path:
    """Write an mf-named state as a Hugging Face directory (config.json + safetensors [+ index]).

    `max_shard_size` (bytes or "2GB") splits into shards with `model.safetensors.index.json`;
    `tokenizer` ({file name: bytes}, e.g. tokenizer.model + tokenizer_config.json) goes beside.
    The directory appears complete or not at all; a non-empty `out_dir` needs `overwrite=True`.
    """
    hf_state = mf_to_hf(mf_state, hf_config)
    entries = [Entry.of(name, arr) for name, arr in hf_state.items()]
    with atomic_output_dir(out_dir, overwrite=overwrite) as tmp:
        write_hf_files(tmp, entries, hf_config, max_shard_size, generation_config=generation_config,
                       tokenizer=tokenizer, progress=progress)
    return Path(out_dir)
