"""`load_config` / `dump_config`: YAML (or a mapping) in, validated `TrainConfig` out, and back.

Loading is: read the YAML -> apply `--set` overrides to the raw mapping -> build the typed
sections (types, unknown keys, single-field rules) -> check the run mode's required sections ->
resolve defaults that depend on other fields -> cross-field rules. The first problem found is
raised as a one-line `ConfigError`.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from typing import Any

from mf_config.config import REQUIRED_SECTIONS, TrainConfig
from mf_config.errors import ConfigError, type_name
from mf_config.overrides import apply_overrides
from mf_config.rules import check_rules
from mf_config.schema import build_section, section_to_dict
from mf_config.yaml_io import dump_yaml, read_yaml


def _raw_mapping(path_or_mapping: Any) -> tuple[Any, str]:
    if isinstance(path_or_mapping, Mapping):
        return copy.deepcopy(dict(path_or_mapping)), "config"
    if isinstance(path_or_mapping, (str, os.PathLike)):
        source = os.fspath(path_or_mapping)
        return read_yaml(source), source
    raise TypeError(f"load_config takes a file path or a mapping, not {type(path_or_mapping).__name__}")


def load_config(path_or_mapping: str | os.PathLike | Mapping[str, Any], overrides: Sequence[str] = ()) -> TrainConfig:
    """Load, override and validate a training config.

    `path_or_mapping` is a YAML file or an already-parsed mapping (not modified). `overrides` are
    `KEY=VALUE` strings as given to `--set`, applied in order before validation. Raises
    `ConfigError` (one line, naming the key path and the bad value) for any bad input.
    """
    if isinstance(overrides, str):
        overrides = [overrides]
    raw, source = _raw_mapping(path_or_mapping)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(source, f"the top level must be a mapping of sections, got {type_name(raw)}")
    apply_overrides(raw, overrides)
    if not raw:
        required = ", ".join(REQUIRED_SECTIONS["train"])
        raise ConfigError(source, f"the config is empty; required sections: {required}")
    cfg = build_section(TrainConfig, raw, "")
    missing = [name for name in REQUIRED_SECTIONS[cfg.run_mode] if name not in raw]
    if missing:
        raise ConfigError(missing[0], f"required section is missing (run_mode {cfg.run_mode!r} needs: "
                                      f"{', '.join(REQUIRED_SECTIONS[cfg.run_mode])})")
    _resolve_defaults(cfg)
    check_rules(cfg)
    return cfg


def _resolve_defaults(cfg: TrainConfig) -> None:
    """Defaults that depend on other fields, resolved once so `show` prints what a run uses."""
    if not cfg.checkpoint.save_path:
        cfg.checkpoint.save_path = os.path.join(cfg.output_dir, "checkpoint")


def config_to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """Plain data with every field (defaults included), in dump order; pass-through keys are
    written back into their sections. `load_config(config_to_dict(cfg)) == cfg`."""
    return section_to_dict(cfg)


def dump_config(cfg: TrainConfig) -> str:
    """The resolved config as YAML; `load_config` on it gives back an equal `TrainConfig`."""
    return dump_yaml(config_to_dict(cfg))
