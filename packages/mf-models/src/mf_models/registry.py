"""Model registry: `model_type` / `architectures` -> (args dataclass, model class), and build_model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .common.args import BaseArgs
from .common.transformer import CausalLM, init_weights
from .deepseek_v3 import DeepseekV3Args, DeepseekV3ForCausalLM
from .deepseek_v3.parallelize import parallelize_deepseek_v3
from .errors import ModelConfigError, did_you_mean
from .llama import LlamaArgs, LlamaForCausalLM
from .llama.parallelize import parallelize_llama
from .mixtral import MixtralArgs, MixtralForCausalLM
from .mixtral.parallelize import parallelize_mixtral
from .qwen2 import Qwen2Args, Qwen2ForCausalLM
from .qwen2.parallelize import parallelize_qwen2
from .qwen3 import Qwen3Args, Qwen3ForCausalLM
from .qwen3.parallelize import parallelize_qwen3
from .qwen3_moe import Qwen3MoeArgs, Qwen3MoeForCausalLM
from .qwen3_moe.parallelize import parallelize_qwen3_moe


@dataclass(frozen=True)
class ModelSpec:
    model_type: str
    architecture: str
    args_cls: type[BaseArgs]
    model_cls: type[CausalLM]
    # `parallelize(model, mesh, options) -> model`: the model's TP/recompute/FSDP plan (None: the
    # model has none, and a layout with more than one rank is refused for it).
    parallelize: Callable[..., Any] | None = None


_BY_TYPE: dict[str, ModelSpec] = {}
_BY_ARCH: dict[str, ModelSpec] = {}


def register_model(spec: ModelSpec) -> None:
    """Add a model; a later package can register its own under a new model_type/architecture."""
    for table, key in ((_BY_TYPE, spec.model_type), (_BY_ARCH, spec.architecture)):
        if key in table and table[key] != spec:
            raise ValueError(f"model {key!r} is already registered")
        table[key] = spec


for _spec in (ModelSpec("llama", "LlamaForCausalLM", LlamaArgs, LlamaForCausalLM, parallelize_llama),
              ModelSpec("qwen3", "Qwen3ForCausalLM", Qwen3Args, Qwen3ForCausalLM, parallelize_qwen3),
              ModelSpec("deepseek_v3", "DeepseekV3ForCausalLM", DeepseekV3Args, DeepseekV3ForCausalLM,
                        parallelize_deepseek_v3),
              ModelSpec("qwen2", "Qwen2ForCausalLM", Qwen2Args, Qwen2ForCausalLM, parallelize_qwen2),
              ModelSpec("mixtral", "MixtralForCausalLM", MixtralArgs, MixtralForCausalLM, parallelize_mixtral),
              ModelSpec("qwen3_moe", "Qwen3MoeForCausalLM", Qwen3MoeArgs, Qwen3MoeForCausalLM,
                        parallelize_qwen3_moe)):
    register_model(_spec)


def available_models() -> dict[str, str]:
    """{model_type: architecture} of every registered model."""
    return {t: s.architecture for t, s in sorted(_BY_TYPE.items())}


def _available() -> str:
    return ", ".join(f"{t} ({a})" for t, a in available_models().items())


def resolve_spec(model_type: Any = None, architectures: Any = None) -> ModelSpec:
    """The spec named by model_type and/or architectures (a name or HF's one-element list)."""
    arch = architectures
    if isinstance(arch, (list, tuple)):
        if len(arch) != 1:
            raise ModelConfigError(f"model.architectures: expected one architecture, got {list(arch)!r}")
        arch = arch[0]
    spec_t = spec_a = None
    if model_type is not None:
        spec_t = _BY_TYPE.get(model_type)
        if spec_t is None:
            raise ModelConfigError(f"model.model_type: unknown {model_type!r};{did_you_mean(str(model_type), _BY_TYPE)} "
                                   f"available: {_available()}")
    if arch is not None:
        spec_a = _BY_ARCH.get(arch)
        if spec_a is None:
            raise ModelConfigError(f"model.architectures: unknown {arch!r};{did_you_mean(str(arch), _BY_ARCH)} "
                                   f"available: {_available()}")
    if spec_t and spec_a and spec_t is not spec_a:
        raise ModelConfigError(f"model.architectures: {arch!r} does not belong to model_type {model_type!r} "
                               f"(expected {spec_t.architecture!r})")
    spec = spec_t or spec_a
    if spec is None:
        raise ModelConfigError(f"model.model_type: missing (and no architectures); available: {_available()}")
    return spec


def build_args(model_section: dict[str, Any]) -> tuple[ModelSpec, BaseArgs]:
    """Validate a `model` mapping (YAML section or HF config.json dict) into the model's args."""
    if not isinstance(model_section, dict):
        raise ModelConfigError(f"model: expected a mapping, got {type(model_section).__name__}")
    section = dict(model_section)
    spec = resolve_spec(section.pop("model_type", None), section.pop("architectures", None))
    try:
        args = spec.args_cls.from_section(section, f"{spec.model_type} ({spec.architecture})")
    except TypeError as exc:  # defensive: dataclass signature errors become config errors
        raise ModelConfigError(f"model: {exc}") from None
    return spec, args


def build_model(model_section: dict[str, Any], *, seed: int = 0, init: bool = True) -> CausalLM:
    """Build a model from a `model` mapping; weights initialised from `seed` unless `init=False`
    (e.g. when a checkpoint is loaded right after)."""
    spec, args = build_args(model_section)
    model = spec.model_cls(args)
    if init:
        init_weights(model, seed)
    return model


def parallelize_model(model: CausalLM, mesh, options=None) -> CausalLM:
    """Apply the model's own parallel plan (tensor + sequence parallelism, recompute, FSDP/HSDP in
    that order) for `mesh` (`mf_parallel.init_mesh(dims)`); `options` is a
    `mf_models.ParallelOptions`. In place, before the first call; returns `model`."""
    spec = next((s for s in _BY_TYPE.values() if isinstance(model, s.model_cls)), None)
    if spec is None:
        raise ModelConfigError(f"parallelize_model: {type(model).__name__} is not a registered model")
    if spec.parallelize is None:
        if mesh.dims.world_size > 1:
            raise ModelConfigError(f"parallelism: {spec.model_type} has no parallel plan; run it on one rank")
        return model
    return spec.parallelize(model, mesh, options)
