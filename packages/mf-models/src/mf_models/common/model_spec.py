"""What a model folder declares about itself (`<model>/spec.py`: `SPEC = ModelSpec(...)`).

The registry (registry.py) finds every folder holding a `spec.py` and registers its `SPEC`; nothing
else names the model. A spec imports only the folder's args class and data, never MindSpore: the
model class and its parallel plan are "module:attribute" strings imported on first use, so
resolving a model_type, validating its arguments and sizing it from a YAML (`mf config validate`,
`mf plan`) cost milliseconds.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .args import BaseArgs


def resolve_ref(ref: Any) -> Any:
    """A class or function given as itself or as "package.module:name" (imported now)."""
    if not isinstance(ref, str):
        return ref
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class ModelSpec:
    """One model: its names, argument class, model class, parallel plan, inventory and tiny preset.

    `model_ref` / `parallelize_ref`: the model class and `parallelize(model, mesh, options) -> model`
    (its TP/recompute/FSDP plan), each as itself or a "module:name" string; `parallelize_ref` None:
    the model has no plan, and a layout with more than one rank is refused for it.
    `inventory`: what `parameter_inventory` / `saved_activations` ask (an object with
    `parameters(args)` and `activations(args, seq, tp, fused_attention, layer)`, e.g.
    `common.inventory.DecoderInventory`); None: not tabulated, and `mf plan` says so.
    `tiny`: the model's keys of its tiny preset, laid over `presets.TINY_SIZES`
    (`tiny_model_section`); None: no preset.
    """

    model_type: str
    architecture: str
    args_cls: type[BaseArgs]
    model_ref: Any
    parallelize_ref: Any = None
    inventory: Any = None
    tiny: dict[str, Any] | None = None

    @property
    def model_cls(self) -> type:
        return resolve_ref(self.model_ref)

    @property
    def parallelize(self) -> Callable[..., Any] | None:
        return resolve_ref(self.parallelize_ref)
