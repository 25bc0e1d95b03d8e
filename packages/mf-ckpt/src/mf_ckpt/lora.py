"""LoRA adapter checkpoints: how they are marked, and merging them into their base weights.

An adapter checkpoint is an ordinary mf checkpoint whose model part holds only the adapter
tensors of each adapted Linear module `m` (`m.lora_a` [r, in], `m.lora_b` [out, r]) and whose
common.json carries the marking `common["adapter"]`:

    {"type": "lora", "rank": r, "alpha": a, "dropout": p, "target_modules": regex,
     "exclude_layers": [indices], "modules": [adapted module names],
     "base": absolute path of the base weights (mf checkpoint, merged or HF directory) or null,
     "base_kind": "mf" | "hf" | "safetensors" | null, "base_iteration": iteration of an mf base or null}

The merged weight of module `m` is `W' = W + (alpha / r) * B @ A`, the weight whose plain Linear
computes what the adapted one computes: `x W^T + (alpha / r) (x A^T) B^T` (dropout is the
identity at inference). Everything here is numpy: no MindSpore needed.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from . import dtypes
from .errors import CheckpointError, first_few
from .extract import read_box
from .layout import CheckpointLayout
from .sources import open_source, validate_files
from .st_io import ReaderPool

ADAPTER_KEY = "adapter"
LORA = "lora"
SUFFIXES = (".lora_a", ".lora_b")


def make_lora_adapter_meta(*, rank: int, alpha: float, target_modules: str, modules: list[str],
                           dropout: float = 0.0, exclude_layers: list[int] | None = None,
                           base: str | os.PathLike | None = None, base_kind: str | None = None,
                           base_iteration: int | None = None) -> dict[str, Any]:
    """The `common["adapter"]` marking of a LoRA adapter checkpoint (validated)."""
    meta = {
        "type": LORA, "rank": int(rank), "alpha": float(alpha), "dropout": float(dropout),
        "target_modules": str(target_modules), "exclude_layers": [int(i) for i in exclude_layers or ()],
        "modules": sorted(modules), "base": os.path.abspath(base) if base else None,
        "base_kind": base_kind, "base_iteration": None if base_iteration is None else int(base_iteration),
    }
    return validate_adapter_meta(meta, "adapter")


def validate_adapter_meta(meta: Any, where: str) -> dict[str, Any]:
    if not isinstance(meta, Mapping):
        raise CheckpointError(f"{where}: the adapter marking must be a mapping, got {type(meta).__name__}")
    if meta.get("type") != LORA:
        raise CheckpointError(f"{where}: adapter type {meta.get('type')!r} is not supported (only {LORA!r})")
    rank, alpha = meta.get("rank"), meta.get("alpha")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise CheckpointError(f"{where}: adapter rank must be a positive integer, got {rank!r}")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not alpha > 0 or not math.isfinite(alpha):
        raise CheckpointError(f"{where}: adapter alpha must be a positive number, got {alpha!r}")
    modules = meta.get("modules")
    if modules is not None and (not isinstance(modules, list) or not all(isinstance(m, str) for m in modules)):
        raise CheckpointError(f"{where}: adapter modules must be a list of module names")
    return dict(meta)


def read_adapter_meta(common: Mapping[str, Any], where: str = "checkpoint") -> dict[str, Any] | None:
    """The validated adapter marking of a checkpoint's common.json, or None for ordinary weights."""
    if ADAPTER_KEY not in common:
        return None
    return validate_adapter_meta(common[ADAPTER_KEY], f"{where}: common.json adapter")


def _modules(adapter_names, where: str) -> list[str]:
    modules = set()
    for name in adapter_names:
        if not name.endswith(SUFFIXES):
            raise CheckpointError(f"{where}: tensor {name!r} is not a LoRA tensor (names end in .lora_a / .lora_b)")
        modules.add(name.rsplit(".", 1)[0])
    incomplete = sorted(m for m in modules if not all(m + s in adapter_names for s in SUFFIXES))
    if incomplete:
        raise CheckpointError(f"{where}: module {first_few(incomplete)} has only one of lora_a / lora_b")
    return sorted(modules)


def plan_merge(base_shapes: Mapping[str, tuple[int, ...]], adapter_shapes: Mapping[str, tuple[int, ...]],
               meta: Mapping[str, Any], where: str = "adapter") -> dict[str, str]:
    """Check an adapter against its base by shapes alone; {base weight name: module name}."""
    meta = validate_adapter_meta(meta, where)
    modules = _modules(set(adapter_shapes), where)
    if not modules:
        raise CheckpointError(f"{where}: the adapter holds no LoRA tensors")
    listed = meta.get("modules")
    if listed is not None and sorted(listed) != modules:
        raise CheckpointError(f"{where}: the marking lists modules {first_few(sorted(listed))}, the tensors are of "
                              f"{first_few(modules)}")
    missing = [m + ".weight" for m in modules if m + ".weight" not in base_shapes]
    if missing:
        raise CheckpointError(f"{where}: the base has no weight {first_few(missing)} for adapted module(s); "
                              "is it the base this adapter was trained on?")
    rank = meta["rank"]
    for m in modules:
        w, a, b = tuple(base_shapes[m + ".weight"]), tuple(adapter_shapes[m + ".lora_a"]), tuple(adapter_shapes[m + ".lora_b"])
        if len(w) != 2 or a != (rank, w[1]) or b != (w[0], rank):
            raise CheckpointError(
                f"{where}: module {m!r}: base weight {list(w)}, lora_a {list(a)}, lora_b {list(b)} do not fit a rank-{rank} "
                f"adapter (lora_a must be [{rank}, in], lora_b [out, {rank}] for a weight [out, in])")
    return {m + ".weight": m for m in modules}


def merged_weight(weight: np.ndarray, lora_a: np.ndarray, lora_b: np.ndarray, scale: float,
                  name: str = "weight") -> np.ndarray:
    """`weight + scale * lora_b @ lora_a` in float64, returned in the weight's dtype (BF16 included).
    CheckpointError when that makes values the weight's dtype cannot hold (inf or NaN where the
    base was finite: an alpha like 1e308, or an adapter that diverged), rather than writing them."""
    code = dtypes.code_of(weight.dtype)
    w = dtypes.to_float32(weight).astype(np.float64)
    delta = np.asarray(dtypes.to_float32(lora_b), np.float64) @ np.asarray(dtypes.to_float32(lora_a), np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        merged = w + scale * delta
        out = dtypes.cast(merged.astype(np.float32), code) if code != "F64" else merged
    broken = ~np.isfinite(out if code == "F64" else dtypes.to_float32(out)) & np.isfinite(w)
    if broken.any():
        raise CheckpointError(f"{name}: merging the adapter (alpha / rank = {scale:g}) gives {int(broken.sum())} "
                              f"non-finite value(s) where the base weight is finite; nothing was written")
    return out


def merge_lora(base_state: Mapping[str, np.ndarray], adapter_state: Mapping[str, np.ndarray],
               adapter_meta: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The base state with each adapted weight replaced by `W + (alpha / r) B @ A` (pure numpy).

    Unadapted tensors are the base's own arrays (not copied). Raises CheckpointError (one line) for
    an unmarked or malformed adapter, adapted modules the base lacks, or shapes that do not fit."""
    shapes = {n: tuple(np.shape(v)) for n, v in base_state.items()}
    plan = plan_merge(shapes, {n: tuple(np.shape(v)) for n, v in adapter_state.items()}, adapter_meta)
    scale = float(adapter_meta["alpha"]) / int(adapter_meta["rank"])
    merged = dict(base_state)
    for weight_name, m in plan.items():
        merged[weight_name] = merged_weight(np.asarray(base_state[weight_name]), np.asarray(adapter_state[m + ".lora_a"]),
                                            np.asarray(adapter_state[m + ".lora_b"]), scale, weight_name)
    return merged


def read_all(layout: CheckpointLayout, part: str = "model") -> dict[str, np.ndarray]:
    """Every tensor of one part of a checkpoint, whole (for small or in-memory uses)."""
    headers = validate_files(layout, {(part, n) for n in layout.parts[part]})
    with ReaderPool(headers) as pool:
        return {name: read_box(layout, pool, part, name) for name in layout.parts[part]}


def open_lora_adapter(path, iteration: int | None = None) -> tuple[CheckpointLayout, dict[str, Any]]:
    """The layout and marking of an adapter checkpoint; an unmarked checkpoint is an error."""
    layout = open_source(path, iteration)
    meta = read_adapter_meta(layout.common, str(layout.root))
    if meta is None:
        raise CheckpointError(f"{layout.root}: not a LoRA adapter checkpoint (its common.json has no adapter marking)")
    return layout, meta


def load_lora_adapter(path, iteration: int | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray], dict]:
    """(marking, adapter tensors, common) of an adapter checkpoint."""
    layout, meta = open_lora_adapter(path, iteration)
    state = read_all(layout)
    plan_merge({m + ".weight": (state[m + ".lora_b"].shape[0], state[m + ".lora_a"].shape[-1])
                for m in _modules(set(state), str(layout.root))},
               {n: a.shape for n, a in state.items()}, meta, str(layout.root))
    return meta, state, dict(layout.common)


def open_adapter_base(meta: Mapping[str, Any], where: str, base=None) -> CheckpointLayout:
    """The base weights an adapter records (or `base` instead), refusing an adapter as a base."""
    path = base if base is not None else meta.get("base")
    if not path:
        raise CheckpointError(f"{where}: the adapter records no base weights; merge it explicitly with "
                              "`mf-ckpt merge-lora BASE ADAPTER OUT`")
    if not Path(path).exists():
        raise CheckpointError(f"{where}: the adapter's base {path} does not exist here; merge it explicitly with "
                              "`mf-ckpt merge-lora BASE ADAPTER OUT`")
    iteration = meta.get("base_iteration") if base is None and meta.get("base_kind") == "mf" else None
    try:
        layout = open_source(path, iteration)
    except CheckpointError as exc:
        raise CheckpointError(f"{where}: cannot open the adapter's base: {exc}") from None
    if read_adapter_meta(layout.common, str(layout.root)) is not None:
        raise CheckpointError(f"{layout.root}: the base is itself a LoRA adapter checkpoint; merge it into its own "
                              "base first (mf-ckpt merge-lora)")
    return layout


def load_lora_merged_state(path, *, base=None, dtype: str | None = "float32") -> tuple[dict, dict[str, np.ndarray]]:
    """(adapter common, merged mf-named state) of an adapter checkpoint merged into its base.

    The base is the one the marking records (an mf base at the recorded iteration) unless `base`
    is given. `dtype="float32"` widens every tensor (BF16 included); None keeps the base's dtypes.
    """
    meta, adapter, common = load_lora_adapter(path)
    layout = open_adapter_base(meta, str(path), base)
    merged = merge_lora(read_all(layout), adapter, meta)
    if dtype == "float32":
        merged = {n: dtypes.to_float32(v) for n, v in merged.items()}
    elif dtype is not None:
        raise ValueError(f"dtype must be 'float32' or None, got {dtype!r}")
    return common, merged
