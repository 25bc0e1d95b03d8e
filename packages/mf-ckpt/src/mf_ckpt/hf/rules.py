"""The engine that turns an architecture's rename table plus config.json into a conversion plan.

An architecture (llama.py, qwen3.py, deepseek_v3.py) is pure data: `Rule`s saying which mf tensor
comes from which HF tensor, with a symbolic shape and the config conditions under which it exists.
`build_plan` expands them for one config into `Target`s: each mf tensor and the `Piece`s of HF
tensors it is made of (one piece for a rename; one per expert for a stacked expert tensor; a slice
of a fused tensor for transformers-5 `gate_up_proj`). The same plan drives the in-memory
conversion, the HF reader/writer, and reading an HF directory directly as a `load` source.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import CheckpointError, brief, first_few


@dataclass(frozen=True)
class Rule:
    """mf tensor `mf` <- HF tensor `hf`. Layer rules are relative to `layers.{i}.` / `model.layers.{i}.`.

    `shape` lists symbols from the architecture's `dims`; `when` names conditions that must all
    hold; `experts` means `hf` contains `{e}` and the mf tensor stacks the experts on axis 0.
    """

    mf: str
    hf: str
    shape: tuple[str, ...]
    when: tuple[str, ...] = ()
    experts: bool = False


@dataclass(frozen=True)
class Fused:
    """A transformers-5 fused expert tensor read instead of the per-expert ones (never written).

    `parts` are mf names (relative to the layer) concatenated along `axis` of the HF tensor.
    """

    hf: str
    parts: tuple[str, ...]
    axis: int


class ConfigView:
    """Typed access to config.json with the transformers defaults of one architecture."""

    def __init__(self, config: Mapping[str, Any], model_type: str, defaults: Mapping[str, Any]):
        self.raw = config
        self.model_type = model_type
        self.defaults = defaults

    def _get(self, key: str, default: Any = ...) -> Any:
        """The value of `key`; absent -> `default`, else the architecture default, else an error."""
        if key in self.raw:
            value = self.raw[key]
            # An explicit null means "unset" where a derived default exists (e.g. head_dim).
            return default if value is None and default is not ... else value
        if default is not ...:
            return default
        if key in self.defaults:
            return self.defaults[key]
        raise CheckpointError(f"config.json ({self.model_type}): missing required key {key!r}")

    def int(self, key: str, default: Any = ..., *, minimum: int = 1, nullable: bool = False) -> int | None:
        value = self._get(key, default)
        if value is None and nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise CheckpointError(
                f"config.json ({self.model_type}): {key} must be an integer >= {minimum}"
                f"{' or null' if nullable else ''}, got {value!r}"
            )
        return value

    def bool(self, key: str) -> bool:
        value = self._get(key)
        if not isinstance(value, bool):
            raise CheckpointError(f"config.json ({self.model_type}): {key} must be true or false, got {value!r}")
        return value


@dataclass(frozen=True)
class Architecture:
    model_type: str
    defaults: Mapping[str, Any]
    dims: Callable[[ConfigView], dict[str, int]]
    conditions: Callable[[ConfigView], dict[str, bool]]
    layer_conditions: Callable[[ConfigView, int], dict[str, bool]]
    top: tuple[Rule, ...]
    layer: tuple[Rule, ...]
    fused: tuple[Fused, ...] = ()
    # HF tensors that are legitimately present but have no mf counterpart (e.g. DeepSeek's MTP
    # layer, which transformers itself ignores); skipped with a warning.
    skipped: Callable[[ConfigView], Callable[[str], bool]] = field(default=lambda c: (lambda name: False))
    # transformers' model class, written as config.json's `architectures` when a config lacks it.
    hf_class: str | None = None


@dataclass(frozen=True)
class Piece:
    """Part of an mf tensor (box `offset`+`shape`) stored in HF tensor `hf`.

    `squeeze` lists mf axes the HF tensor does not have (the expert axis); `hf_start` is where the
    box starts inside the HF tensor (non-zero only inside a fused tensor); `hf_shape` is the HF
    tensor's full shape.
    """

    hf: str
    offset: tuple[int, ...]
    shape: tuple[int, ...]
    squeeze: tuple[int, ...]
    hf_start: tuple[int, ...]
    hf_shape: tuple[int, ...]

    @property
    def hf_stop(self) -> tuple[int, ...]:
        kept = [n for axis, n in enumerate(self.shape) if axis not in self.squeeze]
        return tuple(a + n for a, n in zip(self.hf_start, kept))

    @property
    def whole(self) -> bool:
        return not self.squeeze and not any(self.hf_start) and self.shape == self.hf_shape


@dataclass(frozen=True)
class Target:
    mf: str
    shape: tuple[int, ...]
    pieces: tuple[Piece, ...]


@dataclass
class Plan:
    model_type: str
    targets: dict[str, Target]
    skipped: Callable[[str], bool]
    summary: str  # e.g. "llama, 2 layers" for error messages

    def hf_names(self) -> set[str]:
        return {p.hf for t in self.targets.values() for p in t.pieces}


def _whole(hf: str, shape: tuple[int, ...]) -> Piece:
    zeros = (0,) * len(shape)
    return Piece(hf, zeros, shape, (), zeros, shape)


# DeepSeek-V3 (61 layers x 256 experts x 3) is about 47,000 tensors.
MAX_PLAN_PIECES = 300_000


# Keys the model reads that no tensor shape shows: checked with the shapes, so no checkpoint is
# converted that the model would refuse (max_position_embeddings: 0) or run wrongly (rms_norm_eps: NaN).
_POSITIVE_INTS = ("max_position_embeddings",)
_POSITIVE_NUMBERS = ("rms_norm_eps", "rope_theta")


def check_hyperparameters(config: Mapping[str, Any], model_type: str) -> None:
    for key in _POSITIVE_INTS:
        value = config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise CheckpointError(f"config.json ({model_type}): {key} must be an integer >= 1, got {brief(value)}")
    for key in _POSITIVE_NUMBERS:
        value = config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value <= 0):
            raise CheckpointError(f"config.json ({model_type}): {key} must be a finite number > 0, got {brief(value)}")


def build_plan(arch: Architecture, config: Mapping[str, Any], hf_names: Iterable[str] | None = None) -> Plan:
    """Expand `arch` for `config`. With `hf_names`, layers stored fused are planned as fused."""
    check_hyperparameters(config, arch.model_type)
    view = ConfigView(config, arch.model_type, arch.defaults)
    dims = arch.dims(view)
    conditions = arch.conditions(view)
    present = set(hf_names) if hf_names is not None else None
    num_layers = view.int("num_hidden_layers")
    # A crafted config (num_hidden_layers: 10**9) must be refused, not expanded for minutes.
    pieces = num_layers * sum(dims[r.shape[0]] if r.experts else 1 for r in arch.layer)
    if pieces > MAX_PLAN_PIECES:
        raise CheckpointError(f"config.json ({arch.model_type}): num_hidden_layers {num_layers} with these sizes would "
                              f"describe {pieces} tensors, more than any model has (at most {MAX_PLAN_PIECES})")
    targets: dict[str, Target] = {}

    def shape_of(rule: Rule) -> tuple[int, ...]:
        return tuple(dims[s] for s in rule.shape)

    def add(rule: Rule, flags: Mapping[str, bool], mf_prefix: str, hf_prefix: str, fmt: dict) -> None:
        if not all(flags[c] for c in rule.when):
            return
        mf = mf_prefix + rule.mf
        shape = shape_of(rule)
        if rule.experts:
            inner = shape[1:]
            pieces = tuple(
                Piece((hf_prefix + rule.hf).format(e=e, **fmt), (e,) + (0,) * len(inner), (1, *inner), (0,),
                      (0,) * len(inner), inner)
                for e in range(shape[0])
            )
        else:
            pieces = (_whole(hf_prefix + rule.hf, shape),)
        targets[mf] = Target(mf, shape, pieces)

    for rule in arch.top:
        add(rule, conditions, "", "", {})
    for i in range(num_layers):
        flags = {**conditions, **arch.layer_conditions(view, i)}
        mf_prefix, hf_prefix = f"layers.{i}.", f"model.layers.{i}."
        fused = [f for f in arch.fused if present is not None and hf_prefix + f.hf in present]
        fused_parts = {p for f in fused for p in f.parts}
        by_mf = {r.mf: r for r in arch.layer}
        for rule in arch.layer:
            if rule.mf in fused_parts and all(flags[c] for c in rule.when):
                continue
            add(rule, flags, mf_prefix, hf_prefix, {})
        for f in fused:
            rules = [by_mf[p] for p in f.parts]
            if not all(all(flags[c] for c in r.when) for r in rules):
                continue  # fused tensor in a layer that has no experts: reported as unexpected
            shapes = [shape_of(r) for r in rules]
            total = list(shapes[0])
            total[f.axis] = sum(s[f.axis] for s in shapes)
            start = 0
            for part, shape in zip(f.parts, shapes):
                hf_start = tuple(start if axis == f.axis else 0 for axis in range(len(shape)))
                piece = Piece(hf_prefix + f.hf, (0,) * len(shape), shape, (), hf_start, tuple(total))
                targets[mf_prefix + part] = Target(mf_prefix + part, shape, (piece,))
                start += shape[f.axis]
    return Plan(arch.model_type, targets, arch.skipped(view), f"{arch.model_type}, {num_layers} layers")


def check_hf(plan: Plan, found: Mapping[str, tuple[str, tuple[int, ...]]], where: str) -> list[str]:
    """Validate HF tensors {name: (dtype, shape)} against the plan; returns the skipped names."""
    needed = plan.hf_names()
    missing = sorted(needed - found.keys())
    if missing:
        raise CheckpointError(f"{where}: missing tensor {first_few(missing)} required by config.json ({plan.summary})")
    extra = sorted(found.keys() - needed)
    skipped = [n for n in extra if plan.skipped(n)]
    unexpected = [n for n in extra if not plan.skipped(n)]
    if unexpected:
        raise CheckpointError(f"{where}: unexpected tensor {first_few(unexpected)} not described by config.json ({plan.summary})")
    for target in plan.targets.values():
        codes = set()
        for p in target.pieces:
            code, shape = found[p.hf]
            if tuple(shape) != p.hf_shape:
                raise CheckpointError(
                    f"{where}: tensor {p.hf!r} has shape {list(shape)}, config.json implies {list(p.hf_shape)} ({plan.summary})"
                )
            codes.add(code)
        if len(codes) > 1:
            raise CheckpointError(f"{where}: tensors stacked into {target.mf!r} have mixed dtypes {sorted(codes)}")
    return skipped


def check_mf(plan: Plan, found: Mapping[str, tuple[str, tuple[int, ...]]], where: str,
             config_name: str = "config.json") -> None:
    """Validate mf tensors {name: (dtype, shape)} against the plan (`config_name` names the config
    in messages, e.g. "the hf_config in common.json")."""
    missing = sorted(plan.targets.keys() - found.keys())
    if missing:
        raise CheckpointError(f"{where}: missing tensor {first_few(missing)} required by {config_name} ({plan.summary})")
    unexpected = sorted(found.keys() - plan.targets.keys())
    if unexpected:
        raise CheckpointError(f"{where}: unexpected tensor {first_few(unexpected)} not described by {config_name} "
                              f"({plan.summary})")
    for name, target in plan.targets.items():
        shape = tuple(found[name][1])
        if shape != target.shape:
            raise CheckpointError(
                f"{where}: tensor {name!r} has shape {list(shape)}, {config_name} implies {list(target.shape)} "
                f"({plan.summary})"
            )


def layer_prefix_matcher(first: int, count: int) -> Callable[[str], bool]:
    """True for HF names inside `model.layers.{first..first+count-1}.`."""
    if count <= 0:
        return lambda name: False
    pattern = re.compile(r"model\.layers\.(\d+)\.")

    def match(name: str) -> bool:
        m = pattern.match(name)
        return bool(m) and first <= int(m.group(1)) < first + count

    return match
