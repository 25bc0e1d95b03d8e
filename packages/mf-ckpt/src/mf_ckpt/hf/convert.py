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
from . import models
from .rules import Architecture, Plan, Target, build_plan, check_hf, check_mf


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


def plan_for(hf_config: Mapping[str, Any], hf_names=None) -> Plan:
    return build_plan(architecture(hf_config), hf_config, hf_names)


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
        out[box] = part.reshape(p.shape)
    return out


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
    plan = plan_for(hf_config)
    check_mf(plan, _meta(mf_state), "mf state")
    out: dict[str, np.ndarray] = {}
    for name, t in plan.targets.items():
        arr = mf_state[name]
        for p in t.pieces:
            if p.whole:
                out[p.hf] = arr
            else:
                box = tuple(slice(o, o + n) for o, n in zip(p.offset, p.shape))
                out[p.hf] = np.ascontiguousarray(arr[box].reshape(p.hf_shape))
    return out
