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

from . import assets as carried
from . import jsonable
from .carried_configs import carried_generation_config, carried_hf_config
from .ckpt_dir import COMMON, check_iteration
from .errors import CheckpointError
from .extract import read_box
from .fsutil import atomic_output_dir, check_not_an_input, check_output_dir
from .hf.convert import architecture, hf_entries, plan_for
from .hf.io import read_config, write_hf_files
from .hf.rules import check_mf
from .layout import CheckpointLayout
from .peft import export_peft, import_peft, is_peft_dir
from .progress import Progress
from .saver import common_info
from .single_rank import model_entries, write_single_rank_checkpoint
from .sources import open_source, validate_files
from .st_dir import write_tensors
from .st_io import ReaderPool
from .tokenizer_files import hf_tokenizer_files, tokenizer_assets, tokenizer_bytes
from .units import parse_size


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
            write_tensors(tmp, model_entries(layout, pool, part), part, limit, {"format": "mf-ckpt"}, on_bytes=bar.update)
        info = common_info(layout.iteration or 0, 1, jsonable.encode(layout.common))
        info["merged_from"] = {"path": str(layout.root), "kind": layout.kind, "world_size": layout.world_size}
        if tokenizer:
            info[carried.KEY] = carried.to_json(carried.write(tmp, tokenizer))
        (tmp / COMMON).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return Path(out)


def convert_hf_to_mf(src, dst, *, arch: str | None = None, iteration: int = 0, hf_config=None,
                     overwrite: bool = False, progress: bool = False) -> Path:
    """HF directory -> mf checkpoint (world size 1): config.json kept in common.json["hf_config"]
    (generation_config.json in "hf_generation_config"), the tokenizer's files under `tokenizer/`.
    The architecture is config.json's model_type; `arch`, when given, must agree with it. A PEFT
    LoRA directory (adapter_config.json) becomes an adapter checkpoint (peft.py; `hf_config` is
    the base's config.json when the adapter does not name a local base)."""

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

    limit = parse_size(max_shard_size) if max_shard_size is not None else None
    check_not_an_input(dst, [src, hf_config if isinstance(hf_config, (str, Path)) else None], "DST")
    check_output_dir(Path(dst), overwrite=overwrite)
    layout = open_source(src, iteration)
    meta = read_adapter_meta(layout.common, str(layout.root))
    if meta is not None:
        if limit is not None:
            raise CheckpointError(f"{layout.root}: --max-shard-size does not apply to a LoRA adapter (PEFT writes one "
                                  "adapter_model.safetensors)")
        return export_peft(layout, meta, dst, hf_config=carried_hf_config(layout, hf_config), overwrite=overwrite)
    config = carried_hf_config(layout, hf_config)
    plan = plan_for(config, mf_names=layout.parts["model"])
    check_mf(plan, {n: (m.dtype, m.shape) for n, m in layout.parts["model"].items()}, str(layout.root))
    headers = validate_files(layout, {("model", n) for n in plan.targets})
    tokenizer = tokenizer_bytes(layout)
    with atomic_output_dir(dst, overwrite=overwrite) as tmp, ReaderPool(headers) as pool:
        entries = hf_entries(plan, {n: m.dtype for n, m in layout.parts["model"].items()},
                             lambda name, p: read_box(layout, pool, "model", name, p.offset, p.shape))
        write_hf_files(tmp, entries, config, limit, generation_config=carried_generation_config(layout),
                       tokenizer=tokenizer, progress=progress, source=str(layout.root))
    return Path(dst)
