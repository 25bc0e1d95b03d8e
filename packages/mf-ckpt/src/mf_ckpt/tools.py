"""Whole-checkpoint operations behind the CLI: merge, HF -> mf and mf -> HF conversion.

All of them stream: tensors are read from the source one at a time while the output file is
written (memory stays around the largest tensor), into a temp directory renamed into place only
when complete, so a failure never damages the destination. The tokenizer the source carries goes
along (checked against its checksums): into `tokenizer/` of an mf checkpoint or merged directory,
beside config.json in an HF directory. A LoRA adapter checkpoint converts to PEFT's layout and
back (peft.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import assets as carried
from . import jsonable
from .ckpt_dir import COMMON, METADATA, check_iteration, iteration_name, shard_file, write_marker
from .errors import CheckpointError
from .extract import read_box
from .fsutil import atomic_output_dir, check_not_an_input, check_output_dir, read_json
from .global_layout import LocalEntry, build
from .hf.convert import architecture, plan_for
from .hf.io import read_config, write_hf_files
from .hf.rules import check_mf
from .layout import CheckpointLayout
from .progress import Progress
from .saver import common_info, with_checksums
from .sources import open_source, validate_files
from .st_dir import write_tensors
from .st_io import Entry, ReaderPool, write_file
from .tokenizer_files import hf_tokenizer_files, tokenizer_assets, tokenizer_bytes
from .units import parse_size


def _entries(layout: CheckpointLayout, pool: ReaderPool, part: str) -> list[Entry]:
    return [
        Entry(name, meta.dtype, meta.shape, lambda name=name: read_box(layout, pool, part, name))
        for name, meta in layout.parts[part].items()
    ]


def _total(layout: CheckpointLayout, parts) -> int:
    return sum(t.nbytes for p in parts for t in layout.parts[p].values())


def merge(src, out, *, iteration: int | None = None, max_shard_size: int | str | None = None,
          optimizer: bool = True, overwrite: bool = False, progress: bool = False) -> Path:
    """One full copy: `model.safetensors` (+ `optimizer.safetensors`) with whole tensors, or shards
    plus `*.safetensors.index.json` when `max_shard_size` is given; common.json is carried over.
    The result is itself a valid `load` source."""
    limit = parse_size(max_shard_size) if max_shard_size is not None else None
    check_not_an_input(out, [src])
    check_output_dir(Path(out), overwrite=overwrite)
    layout = open_source(src, iteration)
    parts = [p for p in ("model", "optimizer") if p in layout.parts and (optimizer or p == "model")]
    headers = validate_files(layout, {(p, n) for p in parts for n in layout.parts[p]})
    tokenizer = carried.prepare(tokenizer_assets(tokenizer_bytes(layout)))
    with atomic_output_dir(out, overwrite=overwrite) as tmp, ReaderPool(headers) as pool, \
            Progress(_total(layout, parts), "merge", enabled=progress) as bar:
        for part in parts:
            write_tensors(tmp, _entries(layout, pool, part), part, limit, {"format": "mf-ckpt"}, on_bytes=bar.update)
        info = common_info(layout.iteration or 0, 1, jsonable.encode(layout.common))
        info["merged_from"] = {"path": str(layout.root), "kind": layout.kind, "world_size": layout.world_size}
        if tokenizer:
            info[carried.KEY] = carried.to_json(carried.write(tmp, tokenizer))
        (tmp / COMMON).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return Path(out)


def write_single_rank_checkpoint(out: Path, layout: CheckpointLayout | None, pool: ReaderPool | None, iteration: int,
                                 common: dict[str, Any], bar: Progress, prefix: str = "checkpoint",
                                 entries: list[Entry] | None = None, assets: dict[str, bytes] | None = None) -> None:
    """An mf save directory (marker + one iteration, world size 1) holding `layout`'s model, or
    `entries` (same names, dtypes and shapes, e.g. computed from it; required without a layout)
    instead of its stored values, and `assets` (prepared: {"dir/file": bytes})."""
    if entries is None:
        entries = _entries(layout, pool, "model")
    desc = {"model": [LocalEntry(e.name, e.dtype, e.shape, (0,) * len(e.shape), e.shape, 0) for e in entries]}
    global_layout = build([desc], prefix, remove_redundancy=False)
    it_dir = out / iteration_name(iteration)
    it_dir.mkdir()
    file = shard_file(prefix, "model", 0, 1)
    sums: dict[str, int] = {}
    write_file(it_dir / file, entries, {"format": "mf-ckpt"}, on_bytes=bar.update, checksums=sums)
    records = carried.write(it_dir, assets or {})
    (it_dir / METADATA).write_bytes(with_checksums(global_layout.metadata_bytes, {file: sums}, records))
    (it_dir / COMMON).write_text(json.dumps(common_info(iteration, 1, jsonable.encode(common)), indent=2,
                                            sort_keys=True) + "\n")
    write_marker(out, iteration, fsync=False)  # the whole directory is renamed into place afterwards


def convert_hf_to_mf(src, dst, *, arch: str | None = None, iteration: int = 0, hf_config=None,
                     overwrite: bool = False, progress: bool = False) -> Path:
    """HF directory -> mf checkpoint (world size 1): config.json kept in common.json["hf_config"]
    (generation_config.json in "hf_generation_config"), the tokenizer's files under `tokenizer/`.
    The architecture is config.json's model_type; `arch`, when given, must agree with it. A PEFT
    LoRA directory (adapter_config.json) becomes an adapter checkpoint (peft.py; `hf_config` is
    the base's config.json when the adapter does not name a local base)."""
    from .peft import import_peft, is_peft_dir

    iteration = check_iteration(iteration, "--iteration")
    check_not_an_input(dst, [src, hf_config if isinstance(hf_config, (str, Path)) else None], "DST")
    check_output_dir(Path(dst), overwrite=overwrite)
    if not Path(src).is_dir():
        raise CheckpointError(f"{src}: checkpoint directory does not exist")
    if arch is not None:
        architecture({"model_type": arch})  # unknown --arch gets the "supported: ..." message
    if is_peft_dir(Path(src)):
        return import_peft(src, dst, arch=arch, iteration=iteration, hf_config=hf_config, overwrite=overwrite)
    if hf_config is not None:
        raise CheckpointError(f"{src}: --hf-config applies to a PEFT adapter directory; a model directory has its own "
                              "config.json")
    config = read_config(src)
    if arch is not None and config.get("model_type") != arch:
        raise CheckpointError(f"{src}: config.json has model_type {config.get('model_type')!r}, not --arch {arch!r}")
    layout = open_source(src)
    if layout.kind != "hf":
        raise CheckpointError(f"{src}: not a Hugging Face directory (config.json + model.safetensors)")
    headers = validate_files(layout)
    tokenizer = carried.prepare(tokenizer_assets(hf_tokenizer_files(src)))
    with atomic_output_dir(dst, overwrite=overwrite) as tmp, ReaderPool(headers) as pool, \
            Progress(_total(layout, ["model"]), "convert", enabled=progress) as bar:
        write_single_rank_checkpoint(tmp, layout, pool, iteration, dict(layout.common), bar, assets=tokenizer)
    return Path(dst)


def convert_mf_to_hf(src, dst, *, iteration: int | None = None, hf_config=None, max_shard_size=None,
                     overwrite: bool = False, progress: bool = False) -> Path:
    """mf checkpoint (any world size) -> HF directory: config.json, the weights, and, from what the
    checkpoint carries, generation_config.json and the tokenizer's files. The config is the one
    carried in the checkpoint (common.json["hf_config"]) unless `hf_config` (a dict, config.json or
    its dir) is given. A LoRA adapter checkpoint becomes a PEFT adapter directory (peft.py)."""
    from .lora import read_adapter_meta
    from .peft import export_peft

    limit = parse_size(max_shard_size) if max_shard_size is not None else None
    check_not_an_input(dst, [src, hf_config if isinstance(hf_config, (str, Path)) else None], "DST")
    check_output_dir(Path(dst), overwrite=overwrite)
    layout = open_source(src, iteration)
    meta = read_adapter_meta(layout.common, str(layout.root))
    if meta is not None:
        if limit is not None:
            raise CheckpointError(f"{layout.root}: --max-shard-size does not apply to a LoRA adapter (PEFT writes one "
                                  "adapter_model.safetensors)")
        return export_peft(layout, meta, dst, hf_config=_hf_config(layout, hf_config), overwrite=overwrite)
    config = _hf_config(layout, hf_config)
    plan = plan_for(config)
    check_mf(plan, {n: (m.dtype, m.shape) for n, m in layout.parts["model"].items()}, str(layout.root))
    headers = validate_files(layout, {("model", n) for n in plan.targets})
    tokenizer = tokenizer_bytes(layout)
    with atomic_output_dir(dst, overwrite=overwrite) as tmp, ReaderPool(headers) as pool:
        entries = []
        for name, target in plan.targets.items():
            code = layout.parts["model"][name].dtype
            for p in target.pieces:
                entries.append(Entry(p.hf, code, p.hf_shape, lambda name=name, p=p: read_box(
                    layout, pool, "model", name, p.offset, p.shape).reshape(p.hf_shape)))
        write_hf_files(tmp, entries, config, limit, generation_config=_generation_config(layout), tokenizer=tokenizer,
                       progress=progress, source=str(layout.root))
    return Path(dst)


def _generation_config(layout: CheckpointLayout) -> dict | None:
    generation = layout.common.get("hf_generation_config")
    if generation is not None and not isinstance(generation, dict):
        raise CheckpointError(f"{layout.root}: common.json hf_generation_config must be an object, got "
                              f"{type(generation).__name__}")
    return generation


def _hf_config(layout: CheckpointLayout, hf_config) -> dict:
    if hf_config is None:
        config = layout.common.get("hf_config")
        if not isinstance(config, dict):
            raise CheckpointError(
                f"{layout.root}: no Hugging Face config.json carried in the checkpoint; pass one with --hf-config"
            )
        return config
    if isinstance(hf_config, dict):
        return hf_config
    path = Path(hf_config)
    config = read_json(path / "config.json" if path.is_dir() else path, "config.json")
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: config.json must be a JSON object")
    return config
