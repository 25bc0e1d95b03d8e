"""Helpers shared by the mf-config tests: a minimal valid config and loaders around it."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from mf_config import load_config

REPO_ROOT = Path(__file__).resolve().parents[3]
SKELETON = REPO_ROOT / "examples" / "skeleton.yaml"

# The sections the reference requires (model, train_dataset, training), as small as they can be.
# An 8-layer model with 8 heads: layer-spec and head-divisibility rules have something to check.
MINIMAL_SECTIONS = {
    "model": "model:\n  model_type: qwen3\n  num_hidden_layers: 8\n  num_attention_heads: 8\n"
             "  vocab_size: 1000\n  seq_length: 256\n",
    "train_dataset": "train_dataset:\n  dataloader:\n    type: BlendedMegatronDatasetDataLoader\n",
    "training": "training:\n  steps: 100\n",
}


def compose(fragment: str) -> str:
    """`fragment` plus every minimal section it does not define itself."""
    parsed = yaml.safe_load(fragment) if fragment.strip() else {}
    own = set(parsed) if isinstance(parsed, dict) else set()
    return fragment.rstrip("\n") + "\n" + "".join(text for name, text in MINIMAL_SECTIONS.items() if name not in own)


def minimal_dict() -> dict:
    return yaml.safe_load("".join(MINIMAL_SECTIONS.values()))


def deep_merge(base: dict, update: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@pytest.fixture
def load_text(tmp_path):
    """Write `compose(fragment)` to a file and load it as a user would."""

    def _load(fragment: str, overrides=(), complete: bool = True):
        path = tmp_path / "train.yaml"
        path.write_text(compose(fragment) if complete else fragment, encoding="utf-8")
        return load_config(path, overrides=overrides)

    return _load


@pytest.fixture
def build():
    """Load the minimal config with some sections merged in (dicts merge key by key)."""

    def _build(overrides=(), **sections):
        return load_config(deep_merge(minimal_dict(), sections), overrides=overrides)

    return _build
