"""In-memory Hugging Face <-> mf state conversion (pure renames, expert stacking/splitting)."""

from __future__ import annotations

import importlib
import pkgutil
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import dtypes
from ..errors import CheckpointError
from ..st_io import Entry
from . import models
from .rules import Architecture, Piece, Plan, Target, build_plan, check_hf, check_mf


def _rule_files() -> dict[str, Architecture]:
    """model_type -> the `ARCH` of models/<model_type>.py, for every module of that folder."""
    out = {}
    for info in sorted(pkgutil.iter_modules(models.__path__), key=lambda i: i.name):
        arch = importlib.import_module(f"{models.__name__}.{info.name}").ARCH
        if not isinstance(arch, Architecture) or arch.model_type != info.name:
            raise TypeError(f"mf_ckpt/hf/models/{info.name}.py: ARCH must be an Architecture whose model_type is "
                            f"the file's name ({info.name!r})")
        out[arch.model_type] = arch
    return out


ARCHITECTURES: dict[str, Architecture] = _rule_files()


def supported_model_types() -> list[str]:
    return sorted(ARCHITECTURES)


def architecture(hf_config: Mapping[str, Any]) -> Architecture:
    """The rule table for `hf_config["model_type"]`."""
    if not isinstance(hf_config, Mapping):
        raise CheckpointError(f"config.json must be a JSON object, got {type(hf_config).__name__}")
    model_type = hf_config.get("model_type")
    if model_type not in ARCHITECTURES:
        raise CheckpointError(
            f"config.json: unsupported model_type {model_type!r} (supported: {', '.join(supported_model_types())})"
        )
    return ARCHITECTURES[model_type]


def plan_for(hf_config: Mapping[str, Any], hf_names=None, mf_names=None) -> Plan:
    """The conversion plan of `hf_config`; the names of the checkpoint at hand (HF names when
    reading, mf names when writing) say whether its multi-token-prediction layers are in it."""
    return build_plan(architecture(hf_config), hf_config, hf_names, mf_names)


def _meta(state: Mapping[str, np.ndarray]) -> dict[str, tuple[str, tuple[int, ...]]]:
    out = {}
    for name, arr in state.items():
        if not isinstance(arr, np.ndarray):
            raise CheckpointError(f"tensor {name!r} is a {type(arr).__name__}, expected a numpy array")
        out[name] = (dtypes.code_of(arr.dtype), tuple(arr.shape))
    return out


def warn_skipped(skipped: list[str], where: str) -> None:
    if skipped:
        warnings.warn(
            f"{where}: skipped {len(skipped)} tensor(s) with no mf counterpart, e.g. {skipped[0]!r}",
            stacklevel=3,
        )


def assemble(target: Target, read_piece) -> np.ndarray:
    """Build one mf tensor from its pieces; `read_piece(piece)` returns the piece's HF region."""
    if len(target.pieces) == 1 and target.pieces[0].whole:
        return read_piece(target.pieces[0])
    out = None
    for p in target.pieces:
        part = read_piece(p)
        if out is None:
            out = np.empty(target.shape, part.dtype)
        box = tuple(slice(o, o + n) for o, n in zip(p.offset, p.shape))
        out[box] = p.to_mf(part)
    return out


def compose_hf(shape: tuple[int, ...], parts: list[tuple[str, Piece]], read_box) -> np.ndarray:
    """One HF tensor of `shape` from the (mf tensor, piece) pairs written into it (`Plan.hf_tensors`);
    `read_box(mf_name, piece)` returns the piece's mf box. A rename is the box itself."""
    if len(parts) == 1 and parts[0][1].whole:
        return read_box(*parts[0])
    out = None
    for name, p in parts:
        region = p.to_hf(read_box(name, p))
        if out is None:
            out = np.empty(shape, region.dtype)
        out[tuple(slice(a, b) for a, b in zip(p.hf_start, p.hf_stop))] = region
    return out


def hf_entries(plan: Plan, dtypes_of: Mapping[str, str], read_box) -> list:
    """The HF tensors of `plan` as writer entries (computed when written): `dtypes_of` maps mf names
    to dtype codes, `read_box(mf_name, piece)` returns a piece's mf box."""
    return [Entry(hf, dtypes_of[parts[0][0]], shape,
                  lambda shape=shape, parts=parts: compose_hf(shape, parts, read_box).reshape(shape))
            for hf, (shape, parts) in plan.hf_tensors().items()]


def hf_to_mf(hf_state: Mapping[str, np.ndarray], hf_config: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Hugging Face tensor names -> mf names. Renamed tensors are the same array objects."""
    plan = plan_for(hf_config, hf_state.keys())
    warn_skipped(check_hf(plan, _meta(hf_state), "Hugging Face state"), "Hugging Face state")

    def read_piece(p):
        region = hf_state[p.hf]
        if p.whole:
            return region
        return region[tuple(slice(a, b) for a, b in zip(p.hf_start, p.hf_stop))]

    return {name: assemble(t, read_piece) for name, t in plan.targets.items()}


def mf_to_hf(mf_state: Mapping[str, np.ndarray], hf_config: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """mf names -> Hugging Face names (per-expert tensors, the layout transformers saves)."""
    plan = plan_for(hf_config, mf_names=mf_state.keys())
    check_mf(plan, _meta(mf_state), "mf state")

    def read_box(name: str, p: Piece) -> np.ndarray:
        arr = mf_state[name]
        if p.whole:
            return arr
        return arr[tuple(slice(o, o + n) for o, n in zip(p.offset, p.shape))]

    return {hf: np.ascontiguousarray(compose_hf(shape, parts, read_box))
            for hf, (shape, parts) in plan.hf_tensors().items()}
