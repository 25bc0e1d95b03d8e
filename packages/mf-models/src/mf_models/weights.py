"""One way to put a checkpoint's weights into a model: `load_weights(model, source)`.

`source` is anything mf-ckpt loads: a Hugging Face directory (config.json + safetensors), an mf
save directory (its latest committed iteration, or `iteration=N`) or one iteration directory, a
merged directory, or a LoRA adapter checkpoint, which is merged on load into the base weights it
records (`W + alpha / r * B @ A`), so the model is a plain one with the fine-tuned weights.
Strict: every parameter of the model, right shapes, nothing left over. Weights only: whatever
optimizer state the checkpoint holds is not read.

Used by mf-trainer (a fine-tune's base weights, `mf eval`) and inference (`load_pretrained`,
`mf generate`, `mf serve`); errors are `mf_ckpt.CheckpointError` / `ModelStateError` (one line).

`check_weights_fit(section, source)` compares the stored tensors' shapes (metadata and safetensors
headers only) with the shapes a model section implies, before the model is built: a config whose
sizes do not match its weights (`hidden_size: 196608`) is refused in one line naming the tensor
and both shapes, instead of first allocating the model it describes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

import mf_ckpt

from .registry import build_args
from .state import load_state


@dataclass(frozen=True)
class LoadedWeights:
    path: str
    kind: str                     # mf-ckpt's source kind: "hf", "mf", "safetensors"
    iteration: int | None
    common: dict[str, Any]
    adapter: dict[str, Any] | None  # mf-ckpt's LoRA adapter marking, when the source is an adapter

    def describe(self) -> str:
        if self.adapter is not None:
            return (f"LoRA adapter {self.path} (rank {self.adapter['rank']}) merged into its base "
                    f"{self.adapter.get('base')}")
        return f"{self.kind} checkpoint {self.path}" + (f" (iteration {self.iteration})"
                                                         if self.iteration is not None else "")


def check_weights_fit(model_section: dict[str, Any], source: str | os.PathLike, *, iteration: int | None = None,
                      config_name: str = "the model section") -> bool:
    """Raise `mf_ckpt.CheckpointError` (one line: the tensor and both shapes, or a tensor missing)
    when the weights at `source` (for a LoRA adapter: its base's) do not have the shapes
    `model_section` implies. Reads no tensor data. False when mf-ckpt has no rename rules for the
    model type, so nothing could be compared (the strict load still compares, after building)."""
    spec, args = build_args(model_section)
    config = {**args.to_dict(), "model_type": spec.model_type}
    path = os.fspath(source)
    info = mf_ckpt.load(path, {}, strict=False, iteration=iteration)
    adapter = mf_ckpt.read_adapter_meta(info.common, path)
    if adapter is not None:
        if not adapter.get("base") or not os.path.exists(adapter["base"]):
            return False   # the merge says where the base should be
        iteration = adapter.get("base_iteration") if adapter.get("base_kind") == "mf" else None
        path = adapter["base"]
    stored = mf_ckpt.stored_tensors(path, iteration)
    return mf_ckpt.check_config_shapes(config, stored, info.source if adapter is None else path, config_name)


def load_weights(model, source: str | os.PathLike, *, iteration: int | None = None,
                 options: mf_ckpt.LoadOptions | None = None) -> LoadedWeights:
    """Fill `model` from `source` (see the module docstring). `options` carries mf-ckpt's loading
    knobs (load_balanced, load_worker_number); `iteration` picks an mf checkpoint's iteration."""
    path = os.fspath(source)
    info = mf_ckpt.load(path, {}, strict=False)
    adapter = mf_ckpt.read_adapter_meta(info.common, path)
    if adapter is not None:
        _, state = mf_ckpt.load_lora_merged_state(path)
    else:
        state = {name: np.zeros(param.shape, np.float32) for name, param in model.parameters_and_names()}
        opts = mf_ckpt.LoadOptions(load_path=path, no_load_optim=True,
                                   load_balanced=options.load_balanced if options else False,
                                   load_worker_number=options.load_worker_number if options else 1)
        mf_ckpt.load(opts, state, None, iteration=iteration, strict=True)
    load_state(model, state)
    return LoadedWeights(path, info.kind, info.iteration if iteration is None else iteration, dict(info.common),
                         adapter)
