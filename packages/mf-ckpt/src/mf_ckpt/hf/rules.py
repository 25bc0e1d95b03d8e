"""The engine that turns an architecture's rename table plus config.json into a conversion plan.

An architecture (llama.py, qwen3.py, deepseek_v3.py) is pure data: `Rule`s saying which mf tensor
comes from which HF tensor, with a symbolic shape and the config conditions under which it exists.
`build_plan` expands them for one config into `Target`s: each mf tensor and the `Piece`s of HF
tensors it is made of (one piece for a rename; one per expert for a stacked expert tensor; a slice
of a fused tensor for transformers-5 `gate_up_proj`; a slice of a `Packed` tensor such as GPT-2's
`c_attn`, maybe transposed: Conv1D stores [in, out]). The same plan drives the in-memory
conversion, the HF reader/writer, and reading an HF directory directly as a `load` source; an HF
tensor that several pieces point into is written back whole from all of them (`hf_tensors`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import CheckpointError, brief, first_few


@dataclass(frozen=True)
class Rule:
    """mf tensor `mf` <- HF tensor `hf`. Layer rules are relative to `layers.{i}.` / `model.layers.{i}.`.

    `shape` lists symbols from the architecture's `dims`; `when` names conditions that must all
    hold; `experts` means `hf` contains `{e}` and the mf tensor stacks the experts on axis 0;
    `transpose` means the HF tensor is the mf matrix transposed (GPT-2's Conv1D weights [in, out]).
    """

    mf: str
    hf: str
    shape: tuple[str, ...]
    when: tuple[str, ...] = ()
    experts: bool = False
    transpose: bool = False
    # an mf tensor of the main model this HF tensor repeats (MTP rules only; see build_plan)
    copy_of: str | None = None


@dataclass(frozen=True)
class Fused:
    """A transformers-5 fused expert tensor read instead of the per-expert ones (never written).

    `parts` are mf names (relative to the layer) concatenated along `axis` of the HF tensor.
    """

    hf: str
    parts: tuple[str, ...]
    axis: int


@dataclass(frozen=True)
class Packed:
    """One HF tensor holding several mf tensors side by side along its axis `axis`, in the order of
    `parts`, read and written (GPT-2's `c_attn`: q, k, v; GLM-4's `gate_up_proj`: gate, up).

    `parts` are layer rules whose own `hf` is unused; a part whose `when` does not hold is absent
    from the HF tensor; `transpose` on a part stores it transposed, as Conv1D does.
    """

    hf: str
    parts: tuple[Rule, ...]
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
    packed: tuple[Packed, ...] = ()
    # Rules of each multi-token-prediction layer (`model.layers.{num_hidden_layers + k}` in HF,
    # `mtp.{k}.` in mf), for k < `mtp_layers(config)`; the decoder block inside takes the
    # layer rules with `mtp_layer_conditions` (see deepseek_v3.py).
    mtp: tuple[Rule, ...] = ()
    mtp_layers: Callable[[ConfigView], int] = field(default=lambda c: 0)
    # HF tensors that are legitimately present but have no mf counterpart (e.g. DeepSeek's MTP
    # layer, which transformers itself ignores); skipped with a warning.
    skipped: Callable[[ConfigView], Callable[[str], bool]] = field(default=lambda c: (lambda name: False))
    # transformers' model class, written as config.json's `architectures` when a config lacks it.
    hf_class: str | None = None
    # The decoder layer count (GPT-2 calls it n_layer).
    num_layers: Callable[[ConfigView], int] = field(default=lambda c: c.int("num_hidden_layers"))
    # Where layer i's tensors live in HF names (GPT-2: "transformer.h.{i}.").
    hf_layer: str = "model.layers.{i}."
    # A prefix of every HF name that checkpoints saved from the base model leave out (GPT-2's
    # "transformer.": openai-community/gpt2 names its tensors "h.0.attn.c_attn.weight"); read both
    # ways, always written with it (transformers' layout).
    optional_prefix: str | None = None


@dataclass(frozen=True)
class Piece:
    """Part of an mf tensor (box `offset`+`shape`) stored in HF tensor `hf`.

    `squeeze` lists mf axes the HF tensor does not have (the expert axis); `hf_start` is where the
    box starts inside the HF tensor (non-zero only inside a fused or packed tensor); `hf_shape` is
    the HF tensor's full shape; `transpose`: the HF region is the (2-D) box transposed.
    """

    hf: str
    offset: tuple[int, ...]
    shape: tuple[int, ...]
    squeeze: tuple[int, ...]
    hf_start: tuple[int, ...]
    hf_shape: tuple[int, ...]
    transpose: bool = False

    @property
    def hf_region_shape(self) -> tuple[int, ...]:
        kept = tuple(n for axis, n in enumerate(self.shape) if axis not in self.squeeze)
        return kept[::-1] if self.transpose else kept

    @property
    def hf_stop(self) -> tuple[int, ...]:
        return tuple(a + n for a, n in zip(self.hf_start, self.hf_region_shape))

    @property
    def whole(self) -> bool:
        return not self.squeeze and not self.transpose and not any(self.hf_start) and self.shape == self.hf_shape

    def to_mf(self, region):
        """The HF region of this piece (numpy, `hf_region_shape`) as the mf box's values."""
        return (region.T if self.transpose else region).reshape(self.shape)

    def to_hf(self, box):
        """The mf box of this piece as its HF region."""
        kept = box.reshape(tuple(n for axis, n in enumerate(self.shape) if axis not in self.squeeze))
        return kept.T if self.transpose else kept


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
    # HF tensor -> (mf tensor, piece): copies of a shared mf tensor a checkpoint may hold (written,
    # never read: DeepSeek's MTP layers repeat the embedding and the output head)
    copies: dict[str, tuple[str, Piece]] = field(default_factory=dict)

    def hf_names(self) -> set[str]:
        return {p.hf for t in self.targets.values() for p in t.pieces}

    def hf_tensors(self) -> dict[str, tuple[tuple[int, ...], list[tuple[str, Piece]]]]:
        """HF tensor -> (its shape, the (mf tensor, piece) pairs it is written from), in plan order."""
        out: dict[str, tuple[tuple[int, ...], list[tuple[str, Piece]]]] = {}
        for name, target in self.targets.items():
            for p in target.pieces:
                out.setdefault(p.hf, (p.hf_shape, []))[1].append((name, p))
        for hf, (name, p) in self.copies.items():
            out[hf] = (p.hf_shape, [(name, p)])
        return out


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


MTP_PREFIX = "mtp"


def mtp_present(names: Iterable[str], hf_layer: str | None, num_layers: int) -> bool:
    """Whether a set of tensor names holds multi-token-prediction layers: HF names under
    layer `num_hidden_layers` (`hf_layer`: the architecture's layer prefix), or mf names under `mtp.`."""
    prefix = hf_layer.format(i=num_layers) if hf_layer is not None else MTP_PREFIX + "."
    return any(n.startswith(prefix) for n in names)


def build_plan(arch: Architecture, config: Mapping[str, Any], hf_names: Iterable[str] | None = None,
               mf_names: Iterable[str] | None = None) -> Plan:
    """Expand `arch` for `config`. With `hf_names`, layers stored fused are planned as fused.

    The multi-token-prediction layers (`arch.mtp`, as many as config.json says) are planned when the
    names say the checkpoint holds them: HF names (`hf_names`, reading) or mf names (`mf_names`,
    writing); without names, or when the names hold none (transformers saves no MTP layer), the
    plan is the causal LM alone.
    """
    check_hyperparameters(config, arch.model_type)
    view = ConfigView(config, arch.model_type, arch.defaults)
    dims = arch.dims(view)
    conditions = arch.conditions(view)
    present = set(hf_names) if hf_names is not None else None
    num_layers = arch.num_layers(view)
    mtp_layers = 0
    if arch.mtp and (present is not None or mf_names is not None):
        names = present if present is not None else set(mf_names)
        if mtp_present(names, arch.hf_layer if present is not None else None, num_layers):
            mtp_layers = arch.mtp_layers(view)
    # A crafted config (num_hidden_layers: 10**9) must be refused, not expanded for minutes.
    pieces = (num_layers + mtp_layers) * sum(dims[r.shape[0]] if r.experts else 1 for r in arch.layer)
    if pieces > MAX_PLAN_PIECES:
        raise CheckpointError(f"config.json ({arch.model_type}): num_hidden_layers {num_layers} with these sizes would "
                              f"describe {pieces} tensors, more than any model has (at most {MAX_PLAN_PIECES})")
    targets: dict[str, Target] = {}
    copies: dict[str, tuple[str, Piece]] = {}

    def shape_of(rule: Rule) -> tuple[int, ...]:
        return tuple(dims[s] for s in rule.shape)

    def add(rule: Rule, flags: Mapping[str, bool], mf_prefix: str, hf_prefix: str) -> None:
        if not all(flags[c] for c in rule.when):
            return
        mf = mf_prefix + rule.mf
        shape = shape_of(rule)
        if rule.experts:
            inner = shape[1:]
            pieces = tuple(
                Piece((hf_prefix + rule.hf).format(e=e), (e,) + (0,) * len(inner), (1, *inner), (0,),
                      (0,) * len(inner), inner)
                for e in range(shape[0])
            )
        elif rule.transpose:
            zeros = (0,) * len(shape)
            pieces = (Piece(hf_prefix + rule.hf, zeros, shape, (), zeros, shape[::-1], True),)
        else:
            pieces = (_whole(hf_prefix + rule.hf, shape),)
        targets[mf] = Target(mf, shape, pieces)

    def add_packed(packed: Packed, flags: Mapping[str, bool], mf_prefix: str, hf_prefix: str) -> None:
        parts = [r for r in packed.parts if all(flags[c] for c in r.when)]
        if not parts:
            return
        regions = [shape_of(r)[::-1] if r.transpose else shape_of(r) for r in parts]
        total = list(regions[0])
        total[packed.axis] = sum(r[packed.axis] for r in regions)
        start = 0
        for rule, region in zip(parts, regions):
            shape = shape_of(rule)
            hf_start = tuple(start if axis == packed.axis else 0 for axis in range(len(region)))
            piece = Piece(hf_prefix + packed.hf, (0,) * len(shape), shape, (), hf_start, tuple(total), rule.transpose)
            targets[mf_prefix + rule.mf] = Target(mf_prefix + rule.mf, shape, (piece,))
            start += region[packed.axis]

    def add_layer(flags: Mapping[str, bool], mf_prefix: str, hf_prefix: str) -> None:
        fused = [f for f in arch.fused if present is not None and hf_prefix + f.hf in present]
        fused_parts = {p for f in fused for p in f.parts}
        by_mf = {r.mf: r for r in arch.layer}
        for rule in arch.layer:
            if rule.mf in fused_parts and all(flags[c] for c in rule.when):
                continue
            add(rule, flags, mf_prefix, hf_prefix)
        for packed in arch.packed:
            add_packed(packed, flags, mf_prefix, hf_prefix)
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

    for rule in arch.top:
        add(rule, conditions, "", "")
    for i in range(num_layers):
        add_layer({**conditions, **arch.layer_conditions(view, i)}, f"layers.{i}.", arch.hf_layer.format(i=i))
    for k in range(mtp_layers):
        flags = {**conditions, **arch.layer_conditions(view, num_layers + k)}
        mf_prefix, hf_prefix = f"{MTP_PREFIX}.{k}.", arch.hf_layer.format(i=num_layers + k)
        for rule in arch.mtp:
            if rule.copy_of is not None:
                # The checkpoint's own copy of a shared tensor (DeepSeek stores the embedding and
                # the output head again in each MTP layer): written from the shared tensor, read
                # from the main model's (optional in a checkpoint, so never required).
                if all(flags[c] for c in rule.when):
                    shape = shape_of(rule)
                    copies[hf_prefix + rule.hf] = (rule.copy_of, _whole(hf_prefix + rule.hf, shape))
                continue
            add(rule, flags, mf_prefix, hf_prefix)
        add_layer(flags, mf_prefix + "block.", hf_prefix)
    summary = f"{arch.model_type}, {num_layers} layers" + (f" + {mtp_layers} MTP" if mtp_layers else "")
    plan = Plan(arch.model_type, targets, arch.skipped(view), summary, copies)
    prefix = arch.optional_prefix
    if prefix and present and not any(n.startswith(prefix) for n in present):
        bare = _without_prefix(plan, prefix)
        if bare.hf_names() & present:
            return bare
    return plan


def _without_prefix(plan: Plan, prefix: str) -> Plan:
    """The plan reading a checkpoint whose HF names leave out `prefix` (Architecture.optional_prefix)."""
    def strip(p: Piece) -> Piece:
        return replace(p, hf=p.hf[len(prefix):]) if p.hf.startswith(prefix) else p

    targets = {n: replace(t, pieces=tuple(strip(p) for p in t.pieces)) for n, t in plan.targets.items()}
    copies = {hf[len(prefix):] if hf.startswith(prefix) else hf: (n, strip(p)) for hf, (n, p) in plan.copies.items()}
    return Plan(plan.model_type, targets, lambda name: plan.skipped(prefix + name), plan.summary, copies)


def check_hf(plan: Plan, found: Mapping[str, tuple[str, tuple[int, ...]]], where: str) -> list[str]:
    """Validate HF tensors {name: (dtype, shape)} against the plan; returns the skipped names."""
    needed = plan.hf_names()
    missing = sorted(needed - found.keys())
    if missing:
        raise CheckpointError(f"{where}: missing tensor {first_few(missing)} required by config.json ({plan.summary})")
    for name, (_, piece) in plan.copies.items():
        if name in found and tuple(found[name][1]) != piece.hf_shape:
            raise CheckpointError(f"{where}: tensor {name!r} has shape {list(found[name][1])}, config.json implies "
                                  f"{list(piece.hf_shape)} ({plan.summary})")
    extra = sorted(found.keys() - needed - plan.copies.keys())
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
