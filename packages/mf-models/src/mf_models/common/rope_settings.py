"""Rotary position embedding settings: HF `rope_parameters` / legacy `rope_scaling` validated into one
rope dict (the kinds and their keys are described in rope.py, which computes the frequencies).

Kept apart from rope.py (and free of MindSpore and numpy) because the model argument classes use it,
and checking a config's model section must not cost a MindSpore import.
"""

from __future__ import annotations

from typing import Any

from ..errors import ModelConfigError, did_you_mean

_TYPE_KEYS: dict[str, set[str]] = {
    "default": set(),
    "linear": {"factor"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
    "yarn": {"factor", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
             "original_max_position_embeddings", "truncate"},
}
_COMMON_KEYS = {"rope_type", "rope_theta", "partial_rotary_factor"}
_REJECTED = {
    "dynamic": "dynamic NTK scaling recomputes frequencies from the running sequence length (stateful in HF); "
               "not supported in a static-shape compiled model",
    "longrope": "longrope switches factor sets with the running sequence length; not supported",
}


def normalize_rope(rope_parameters: dict | None, rope_scaling: dict | None, rope_theta: float | None,
                   default_theta: float = 10000.0, *, partial_rotary: float | None = None,
                   legacy_partial: float | None = None) -> dict[str, Any]:
    """One validated rope dict {rope_type, rope_theta, ...} from v5 `rope_parameters` or legacy fields.

    `partial_rotary`: the model rotates only a fraction of each head (GLM-4: 0.5 unless the config
    says otherwise); its default, or None for a model that rotates whole heads (any other factor
    is refused). Then the dict carries `partial_rotary_factor` (from rope_parameters, or the legacy
    top-level key `legacy_partial`, which must agree)."""
    if rope_parameters is not None and not isinstance(rope_parameters, dict):
        raise ModelConfigError(f"model.rope_parameters: must be a mapping, got {rope_parameters!r}")
    if rope_scaling is not None and not isinstance(rope_scaling, dict):
        raise ModelConfigError(f"model.rope_scaling: must be a mapping or null, got {rope_scaling!r}")
    def renamed(d: dict | None) -> dict | None:  # BC: HF's old configs say "type"
        if d is None or "type" not in d:
            return d
        d = dict(d)
        kind = d.pop("type")
        if "rope_type" not in d:
            d["rope_type"] = kind
        return d

    rope_parameters, rope_scaling = renamed(rope_parameters), renamed(rope_scaling)
    if rope_parameters is not None and rope_scaling is not None:
        merged = {**rope_parameters}
        for key, value in rope_scaling.items():
            if key in merged and merged[key] != value:
                raise ModelConfigError(
                    f"model.rope_scaling.{key}: {value!r} contradicts rope_parameters.{key}={merged[key]!r}; "
                    "give one of them")
            merged[key] = value
        rope_parameters = merged
    source = "rope_parameters" if rope_parameters is not None else "rope_scaling"
    raw = dict(rope_parameters if rope_parameters is not None else (rope_scaling or {}))
    if rope_theta is not None:
        if "rope_theta" in raw and float(raw["rope_theta"]) != float(rope_theta):
            raise ModelConfigError(
                f"model.rope_theta: {rope_theta!r} contradicts {source}.rope_theta={raw['rope_theta']!r}")
        raw["rope_theta"] = rope_theta
    rope_type = raw.pop("rope_type", None) or "default"
    if rope_type in _REJECTED:
        raise ModelConfigError(f"model.{source}.rope_type: {rope_type!r} is not supported ({_REJECTED[rope_type]})")
    if rope_type not in _TYPE_KEYS:
        raise ModelConfigError(
            f"model.{source}.rope_type: unknown {rope_type!r};{did_you_mean(rope_type, _TYPE_KEYS)} "
            f"accepted: {', '.join(sorted(_TYPE_KEYS))}")
    allowed = _TYPE_KEYS[rope_type] | _COMMON_KEYS
    for key in raw:
        if key not in allowed:
            raise ModelConfigError(
                f"model.{source}.{key}: not a parameter of rope_type {rope_type!r};{did_you_mean(key, allowed)} "
                f"accepted: {', '.join(sorted(allowed))}")
    for key, value in raw.items():
        expected = bool if key == "truncate" else (int, float)
        if value is not None and (not isinstance(value, expected) or (expected is not bool and isinstance(value, bool))):
            raise ModelConfigError(f"model.{source}.{key}: expected {'a bool' if key == 'truncate' else 'a number'}, "
                                   f"got {value!r}")
    given = raw.pop("partial_rotary_factor", None)
    if legacy_partial is not None:
        if given is not None and float(given) != float(legacy_partial):
            raise ModelConfigError(f"model.partial_rotary_factor: {legacy_partial!r} contradicts "
                                   f"{source}.partial_rotary_factor={given!r}; give one of them")
        given = legacy_partial
    if partial_rotary is None:
        if given is not None and float(given) != 1.0:
            raise ModelConfigError(f"model.{source}.partial_rotary_factor: this model rotates whole heads; only 1.0 "
                                   f"is supported, got {given}")
    else:
        partial = float(given) if given is not None else float(partial_rotary)
        if not 0.0 < partial <= 1.0:
            raise ModelConfigError(f"model.{source}.partial_rotary_factor: must be in (0, 1], got {partial}")
    out: dict[str, Any] = {"rope_type": rope_type, "rope_theta": float(raw.pop("rope_theta", default_theta))}
    if partial_rotary is not None:
        out["partial_rotary_factor"] = partial
    if out["rope_theta"] <= 0:
        raise ModelConfigError(f"model.{source}.rope_theta: must be positive, got {out['rope_theta']}")
    out.update(raw)
    if rope_type in ("linear", "llama3") and "factor" not in out:
        raise ModelConfigError(f"model.{source}.factor: required for rope_type {rope_type!r}")
    if rope_type == "llama3":
        for key in ("low_freq_factor", "high_freq_factor"):
            if key not in out:
                raise ModelConfigError(f"model.{source}.{key}: required for rope_type 'llama3'")
    if rope_type == "yarn" and out.get("factor") is None and out.get("original_max_position_embeddings") is None:
        raise ModelConfigError(f"model.{source}.factor: required for rope_type 'yarn'")
    return out
