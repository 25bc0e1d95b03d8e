"""Model registry: `model_type` / `architectures` -> the model's spec, and build_model.

Every model folder declares itself in its `spec.py` (`SPEC = common.model_spec.ModelSpec(...)`): the
registry finds the folders of this package holding one and registers their specs when it is
imported, so adding a model is adding its folder (README: "Adding a model"). A spec names its model
class and parallel plan as "module:attribute" strings, imported on first use: resolving a
model_type, validating its arguments (`build_args`, what `mf config validate` and the trainer's
preflight do) and its inventory (`mf plan`) need only the args classes, never MindSpore.
"""

from __future__ import annotations

import importlib
from importlib import resources
from typing import Any

from .common.args import BaseArgs
from .common.inventory import ParamEntry
from .common.model_spec import ModelSpec
from .errors import ModelConfigError, did_you_mean

__all__ = ["ModelSpec", "available_models", "build_args", "build_model", "parallelize_model", "parameter_inventory",
           "register_model", "resolve_spec", "saved_activations", "spec_for_args"]

_BY_TYPE: dict[str, ModelSpec] = {}
_BY_ARCH: dict[str, ModelSpec] = {}


def register_model(spec: ModelSpec) -> None:
    """Add a model; a later package can register its own under a new model_type/architecture."""
    for table, key in ((_BY_TYPE, spec.model_type), (_BY_ARCH, spec.architecture)):
        if key in table and table[key] != spec:
            raise ValueError(f"model {key!r} is already registered")
        table[key] = spec


def _register_folders() -> None:
    """Register the SPEC of every folder of this package that holds a `spec.py` (its name is the
    folder's; listing the folders reads a directory, importing a spec imports its args only)."""
    for entry in sorted(resources.files(__package__).iterdir(), key=lambda e: e.name):
        if entry.is_dir() and entry.joinpath("spec.py").is_file():
            spec = importlib.import_module(f"{__package__}.{entry.name}.spec").SPEC
            if spec.model_type != entry.name:
                raise ValueError(f"mf_models/{entry.name}/spec.py declares model_type {spec.model_type!r}; a "
                                 f"model folder is named after its model_type")
            register_model(spec)


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


def spec_for_args(args: BaseArgs) -> ModelSpec:
    """The spec whose args class `args` is an instance of (exactly: a subclass is another model)."""
    for spec in _BY_TYPE.values():
        if type(args) is spec.args_cls:
            return spec
    raise ModelConfigError(f"model: no registered model for arguments of type {type(args).__name__}")


def _inventory(args: BaseArgs, what: str):
    spec = spec_for_args(args)
    if spec.inventory is None:
        covered = ", ".join(t for t, s in sorted(_BY_TYPE.items()) if s.inventory is not None)
        raise ModelConfigError(f"model.model_type: the {what} inventory of {spec.model_type} is not tabulated yet; "
                               f"covered: {covered}")
    return spec.inventory


def parameter_inventory(args: BaseArgs) -> list[ParamEntry]:
    """The parameters `build_model` makes for `args` (validated args, e.g. from `build_args`): names,
    shapes and tensor-parallel axes in `parameters_and_names()` order, without building the model
    (common/inventory.py)."""
    return _inventory(args, "parameter").parameters(args)


def saved_activations(args: BaseArgs, seq: int, tp: int = 1, *, fused_attention: bool = False, layer: int = 0
                      ) -> dict[str, int]:
    """Elements one sample of `seq` tokens keeps alive from forward to backward, per module of decoder
    layer `layer` and for the model's ends, on one of `tp` tensor-parallel ranks (the terms:
    `DecoderInventory.activations`)."""
    return _inventory(args, "activation").activations(args, seq, tp, fused_attention=fused_attention, layer=layer)


_register_folders()
