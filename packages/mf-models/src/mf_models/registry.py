"""Model registry: `model_type` / `architectures` -> (args dataclass, model class), and build_model.

A spec names its model class and parallel plan as "module:attribute" strings, imported on first
use: resolving a model_type and validating its arguments (`build_args`, what `mf config validate`
and the trainer's preflight do) needs only the args dataclasses, never MindSpore.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .common.args import BaseArgs
from .deepseek_v3.args import DeepseekV3Args
from .errors import ModelConfigError, did_you_mean
from .glm.args import GlmArgs
from .glm4.args import Glm4Args
from .glm4_moe.args import Glm4MoeArgs
from .gpt2.args import Gpt2Args
from .llama.args import LlamaArgs
from .mixtral.args import MixtralArgs
from .qwen2.args import Qwen2Args
from .qwen2_moe.args import Qwen2MoeArgs
from .qwen3.args import Qwen3Args
from .qwen3_moe.args import Qwen3MoeArgs


def _resolve(ref: Any) -> Any:
    """A class or function given as itself or as "package.module:name" (imported now)."""
    if not isinstance(ref, str):
        return ref
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class ModelSpec:
    """`model_ref` / `parallelize_ref`: the model class and its plan, or "module:name" strings for them
    (imported on first use of `model_cls` / `parallelize`: they need MindSpore)."""

    model_type: str
    architecture: str
    args_cls: type[BaseArgs]
    model_ref: Any
    # `parallelize(model, mesh, options) -> model`: the model's TP/recompute/FSDP plan (None: the
    # model has none, and a layout with more than one rank is refused for it).
    parallelize_ref: Any = None

    @property
    def model_cls(self) -> type:
        return _resolve(self.model_ref)

    @property
    def parallelize(self) -> Callable[..., Any] | None:
        return _resolve(self.parallelize_ref)


_BY_TYPE: dict[str, ModelSpec] = {}
_BY_ARCH: dict[str, ModelSpec] = {}


def register_model(spec: ModelSpec) -> None:
    """Add a model; a later package can register its own under a new model_type/architecture."""
    for table, key in ((_BY_TYPE, spec.model_type), (_BY_ARCH, spec.architecture)):
        if key in table and table[key] != spec:
            raise ValueError(f"model {key!r} is already registered")
        table[key] = spec


for _spec in (ModelSpec("llama", "LlamaForCausalLM", LlamaArgs, "mf_models.llama.model:LlamaForCausalLM",
                        "mf_models.llama.parallelize:parallelize_llama"),
              ModelSpec("qwen3", "Qwen3ForCausalLM", Qwen3Args, "mf_models.qwen3.model:Qwen3ForCausalLM",
                        "mf_models.qwen3.parallelize:parallelize_qwen3"),
              ModelSpec("deepseek_v3", "DeepseekV3ForCausalLM", DeepseekV3Args,
                        "mf_models.deepseek_v3.model:DeepseekV3ForCausalLM",
                        "mf_models.deepseek_v3.parallelize:parallelize_deepseek_v3"),
              ModelSpec("qwen2", "Qwen2ForCausalLM", Qwen2Args, "mf_models.qwen2.model:Qwen2ForCausalLM",
                        "mf_models.qwen2.parallelize:parallelize_qwen2"),
              ModelSpec("mixtral", "MixtralForCausalLM", MixtralArgs, "mf_models.mixtral.model:MixtralForCausalLM",
                        "mf_models.mixtral.parallelize:parallelize_mixtral"),
              ModelSpec("qwen3_moe", "Qwen3MoeForCausalLM", Qwen3MoeArgs,
                        "mf_models.qwen3_moe.model:Qwen3MoeForCausalLM",
                        "mf_models.qwen3_moe.parallelize:parallelize_qwen3_moe"),
              ModelSpec("gpt2", "GPT2LMHeadModel", Gpt2Args, "mf_models.gpt2.model:Gpt2LMHeadModel",
                        "mf_models.gpt2.parallelize:parallelize_gpt2"),
              ModelSpec("glm", "GlmForCausalLM", GlmArgs, "mf_models.glm.model:GlmForCausalLM",
                        "mf_models.glm.parallelize:parallelize_glm"),
              ModelSpec("glm4", "Glm4ForCausalLM", Glm4Args, "mf_models.glm4.model:Glm4ForCausalLM",
                        "mf_models.glm4.parallelize:parallelize_glm4"),
              ModelSpec("qwen2_moe", "Qwen2MoeForCausalLM", Qwen2MoeArgs, "mf_models.qwen2_moe.model:Qwen2MoeForCausalLM",
                        "mf_models.qwen2_moe.parallelize:parallelize_qwen2_moe"),
              ModelSpec("glm4_moe", "Glm4MoeForCausalLM", Glm4MoeArgs, "mf_models.glm4_moe.model:Glm4MoeForCausalLM",
                        "mf_models.glm4_moe.parallelize:parallelize_glm4_moe")):
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


def build_model(model_section: dict[str, Any], *, seed: int = 0, init: bool = True, mtp: bool = False):
    """Build a model from a `model` mapping; weights initialised from `seed` unless `init=False`
    (e.g. when a checkpoint is loaded right after). `mtp`: also build the model's multi-token-
    prediction modules (`num_nextn_predict_layers`, DeepSeek-V3 / GLM-4.5: a training objective;
    the trainer asks for them, inference leaves them out)."""
    spec, args = build_args(model_section)
    model = spec.model_cls(args, mtp=True) if mtp and getattr(args, "num_nextn_predict_layers", 0) else \
        spec.model_cls(args)
    if init:
        from .common.transformer import init_weights

        init_weights(model, seed)
    return model


def parallelize_model(model, mesh, options=None):
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
