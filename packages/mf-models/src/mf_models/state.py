"""Weights in and out of a model as {mf parameter name: numpy array}, and HF directories via mf-ckpt."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from mindspore import Tensor, nn

import mf_ckpt

from .common.transformer import CausalLM
from .errors import ModelStateError
from .registry import build_model


def model_state(model: nn.Cell) -> dict[str, np.ndarray]:
    """Every parameter (trainable or not, e.g. the MoE expert bias) by its contract name."""
    return {name: param.asnumpy() for name, param in model.parameters_and_names()}


def _describe(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


def load_state(model: nn.Cell, state: Mapping[str, Any]) -> None:
    """Copy `state` into the model. Strict: a missing, unexpected or mis-shaped name is one
    `ModelStateError` listing them all, raised before any parameter is touched."""
    params = dict(model.parameters_and_names())
    missing = sorted(set(params) - set(state))
    unexpected = sorted(set(state) - set(params))
    mismatched = sorted(f"{n} {tuple(np.shape(state[n]))} != {tuple(params[n].shape)}"
                        for n in set(params) & set(state) if tuple(np.shape(state[n])) != tuple(params[n].shape))
    problems = []
    if missing:
        problems.append(f"missing {len(missing)}: {_describe(missing)}")
    if unexpected:
        problems.append(f"unexpected {len(unexpected)}: {_describe(unexpected)}")
    if mismatched:
        problems.append(f"shape mismatch {len(mismatched)}: {_describe(mismatched)}")
    if problems:
        raise ModelStateError("state does not match the model: " + "; ".join(problems))
    for name, param in params.items():
        param.set_data(Tensor(_as_float32(state[name]), param.dtype))


def _as_float32(value: Any) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype == mf_ckpt.BF16:  # mf-ckpt's raw bfloat16 (numpy has no bf16): exact widening
        return mf_ckpt.to_float32(array)
    return array.astype(np.float32, copy=False)


def load_hf(hf_dir: str | Path, **overrides: Any) -> CausalLM:
    """Build the model of a Hugging Face directory (config.json + safetensors) and load its weights.

    The conversion (names, expert stacking) is mf-ckpt's `load_hf_state`; `overrides` replace
    config.json keys or add mf extras (e.g. compute_dtype="float16", seq_length=4096). A
    multi-token-prediction layer in the checkpoint is not loaded (the model is built without it).
    """
    config, state = mf_ckpt.load_hf_state(str(hf_dir), dtype="float32")
    model = build_model({**config, **overrides}, init=False)
    # The multi-token-prediction layer (DeepSeek-V3, GLM-4.5) is a training objective, not part of
    # the causal LM built here: its tensors are left out, as transformers leaves them.
    load_state(model, {k: v for k, v in state.items() if not k.startswith("mtp.")})
    return model
