"""The Hugging Face configs an mf checkpoint carries in its common.json (`hf_config`,
`hf_generation_config`), for the exports to HF and PEFT."""

from __future__ import annotations

from pathlib import Path

from .errors import CheckpointError
from .fsutil import read_json
from .layout import CheckpointLayout


def carried_generation_config(layout: CheckpointLayout) -> dict | None:
    """generation_config.json as the checkpoint carries it, or None."""
    generation = layout.common.get("hf_generation_config")
    if generation is not None and not isinstance(generation, dict):
        raise CheckpointError(f"{layout.root}: common.json hf_generation_config must be an object, got "
                              f"{type(generation).__name__}")
    return generation


def carried_hf_config(layout: CheckpointLayout, hf_config) -> dict:
    """config.json: `hf_config` (a mapping, a config.json or a directory holding one), else the one
    the checkpoint carries."""
    if hf_config is None:
        config = layout.common.get("hf_config")
        if not isinstance(config, dict):
            raise CheckpointError(
                f"{layout.root}: no Hugging Face config.json carried in the checkpoint; pass one with --hf-config"
            )
        return config
    if isinstance(hf_config, dict):
        return hf_config
    path = Path(hf_config)
    config = read_json(path / "config.json" if path.is_dir() else path, "config.json")
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: config.json must be a JSON object")
    return config
