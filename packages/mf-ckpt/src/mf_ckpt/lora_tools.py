"""`mf-ckpt merge-lora BASE ADAPTER OUT`: adapter + base -> one ordinary checkpoint (mf or HF).

Streams like the other tools: base tensors are read one at a time while the output is written
(the adapter itself is small and read whole), each adapted weight merged on the way
(`W + (alpha / r) B @ A`, in float64, stored in the base's dtype). Everything is checked before the
first byte is written: the adapter's marking, every adapted module against the base (present,
shapes fitting the rank), the HF plan for `--to hf`. The output goes to a temp directory renamed
into place, so a failure never leaves a half-written OUT. The tokenizer of the fine-tune (the
adapter's, else the base's) goes along, as in `convert`.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from . import assets as carried
from .carried_configs import carried_generation_config, carried_hf_config
from .errors import CheckpointError
from .extract import read_box
from .fsutil import atomic_output_dir, check_not_an_input, check_output_dir
from .hf.convert import hf_entries, plan_for
from .hf.io import write_hf_files
from .hf.rules import check_mf
from .layout import CheckpointLayout
from .lora import merged_weight, open_adapter_base, open_lora_adapter, plan_merge, read_all
from .progress import Progress
from .single_rank import write_single_rank_checkpoint
from .sources import validate_files
from .st_io import Entry, ReaderPool
from .tokenizer_files import tokenizer_assets, tokenizer_bytes
from .units import parse_size


def _same_path(a, b) -> bool:
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except (OSError, TypeError):
        return False


def _output_common(base: CheckpointLayout, adapter_path, adapter_common: dict, meta: dict, iteration: int,
                   hf_config: dict | None) -> dict[str, Any]:
    common: dict[str, Any] = {}
    if hf_config is not None:
        common["hf_config"] = hf_config
    generation = adapter_common.get("hf_generation_config") or base.common.get("hf_generation_config")
    if isinstance(generation, dict):
        common["hf_generation_config"] = generation
    if isinstance(adapter_common.get("train_config"), dict):
        common["train_config"] = adapter_common["train_config"]  # where the tokenizer of the run is recorded
    common["merged_lora"] = {"base": str(Path(base.root).resolve()), "base_kind": base.kind,
                             "base_iteration": base.iteration, "adapter": str(Path(adapter_path).resolve()),
                             "adapter_iteration": iteration, "rank": meta["rank"], "alpha": meta["alpha"],
                             "modules": len(meta.get("modules") or [])}
    return common


def merge_lora_checkpoint(base, adapter, out, *, to: str = "mf", hf_config=None, max_shard_size=None,
                          overwrite: bool = False, progress: bool = False) -> dict[str, Any]:
    """Merge the LoRA `adapter` checkpoint into `base` (mf checkpoint, merged or HF directory) and
    write `out` as an mf checkpoint (`to="mf"`, world size 1, at the adapter's iteration) or a
    Hugging Face directory (`to="hf"`). Returns a summary (modules, rank, alpha, bytes, paths)."""
    if to not in ("mf", "hf"):
        raise CheckpointError(f"--to must be 'mf' or 'hf', got {to!r}")
    if to == "mf" and max_shard_size is not None:
        raise CheckpointError("--max-shard-size applies to --to hf only (an mf checkpoint is one file per rank)")
    limit = parse_size(max_shard_size) if max_shard_size is not None else None
    check_not_an_input(out, [base, adapter, hf_config if isinstance(hf_config, (str, os.PathLike)) else None])
    check_output_dir(Path(out), overwrite=overwrite)
    adapter_layout, meta = open_lora_adapter(adapter)
    adapter_state = read_all(adapter_layout)
    adapter_common = dict(adapter_layout.common)
    iteration = adapter_layout.iteration or 0
    if meta.get("base") and not _same_path(meta["base"], base):
        warnings.warn(f"{adapter} was trained on {meta['base']}, merging into {base} instead", stacklevel=2)
    layout = open_adapter_base(meta, str(adapter), base)
    metas = layout.parts["model"]
    plan = plan_merge({n: m.shape for n, m in metas.items()}, {n: a.shape for n, a in adapter_state.items()},
                      meta, f"{adapter} -> {layout.root}")
    scale = float(meta["alpha"]) / int(meta["rank"])

    def whole(pool, name: str) -> np.ndarray:
        value = read_box(layout, pool, "model", name)
        if name in plan:
            m = plan[name]
            value = merged_weight(value, adapter_state[m + ".lora_a"], adapter_state[m + ".lora_b"], scale, name)
        return value

    config = None
    if to == "hf":
        # The base's own config.json (HF base, or the hf_config an mf base carries), else the run's.
        own = hf_config is not None or isinstance(layout.common.get("hf_config"), dict)
        config = carried_hf_config(layout if own else _with_common(layout, adapter_common), hf_config)
        hf_plan = plan_for(config, mf_names=metas)
        check_mf(hf_plan, {n: (m.dtype, m.shape) for n, m in metas.items()}, str(layout.root))
    else:
        config = layout.common.get("hf_config") or adapter_common.get("hf_config")
        config = config if isinstance(config, dict) else None
    headers = validate_files(layout, {("model", n) for n in metas})
    total = sum(m.nbytes for m in metas.values())
    tokenizer, tokenizer_source = tokenizer_bytes(adapter_layout), str(adapter_layout.root)
    if not tokenizer:
        tokenizer, tokenizer_source = tokenizer_bytes(layout), str(layout.root)
    with atomic_output_dir(out, overwrite=overwrite) as tmp, ReaderPool(headers) as pool:
        if to == "mf":
            entries = [Entry(name, m.dtype, m.shape, lambda name=name: whole(pool, name)) for name, m in metas.items()]
            with Progress(total, "merge-lora", enabled=progress) as bar:
                write_single_rank_checkpoint(tmp, layout, pool, iteration,
                                             _output_common(layout, adapter, adapter_common, meta, iteration, config),
                                             bar, entries=entries, assets=carried.prepare(tokenizer_assets(tokenizer)))
        else:
            def read(name, p):
                if name in plan:  # adapted: merge the whole weight, then cut the piece out of it
                    return whole(pool, name)[tuple(slice(o, o + n) for o, n in zip(p.offset, p.shape))]
                return read_box(layout, pool, "model", name, p.offset, p.shape)

            entries = hf_entries(hf_plan, {n: m.dtype for n, m in metas.items()}, read)
            generation = carried_generation_config(adapter_layout) or carried_generation_config(layout)
            write_hf_files(tmp, entries, config, limit, generation_config=generation, tokenizer=tokenizer,
                           progress=progress, source=tokenizer_source)
    return {"modules": len(plan), "rank": meta["rank"], "alpha": meta["alpha"], "bytes": total,
            "base": str(layout.root), "adapter": str(adapter), "out": str(out), "to": to}


def _with_common(layout: CheckpointLayout, adapter_common: dict) -> CheckpointLayout:
    """The base layout seen with the adapter run's hf_config (a base without one, e.g. merged)."""
    common = dict(layout.common)
    if isinstance(adapter_common.get("hf_config"), dict):
        common["hf_config"] = adapter_common["hf_config"]
    return CheckpointLayout(layout.kind, layout.root, layout.parts, layout.iteration, common, layout.per_rank,
                            layout.world_size, layout.info)
