"""A model ready to generate from a checkpoint directory, with what the directory says about it.

`load_pretrained(path)` takes anything mf-ckpt loads: a Hugging Face directory (config.json +
safetensors), an mf save directory (its latest committed iteration) or one iteration directory, a
merged directory, or a LoRA adapter checkpoint (merged on load into the base it records). The
architecture comes from the checkpoint itself (`config.json`, or the `hf_config` mf-trainer stores
in common.json), so no YAML is needed. Also reported: the EOS ids
(HF's generation_config.json first, then config.json) and a tokenizer the directory points to
(`tokenizer.json` / `tokenizer.model` beside the weights, or the training YAML's `tokenizer.path`
that mf-trainer stores in common.json, when that file still exists).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mf_ckpt

from ..common.transformer import CausalLM
from ..registry import build_model
from ..weights import load_weights


@dataclass
class Pretrained:
    model: CausalLM
    path: str
    kind: str                       # "hf", "mf" or "safetensors" (mf-ckpt's source kinds)
    iteration: int | None
    hf_config: dict[str, Any]
    eos_token_ids: list[int]
    tokenizer_path: str | None      # found with the checkpoint, if any
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        base = Path(self.path).resolve()
        if base.name.startswith("iteration_"):
            base = base.parent
        return base.name or "model"


def _eos_ids(*values: Any) -> list[int]:
    for value in values:
        if value is None:
            continue
        ids = value if isinstance(value, list) else [value]
        if all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            return [int(t) for t in ids]
    return []


def _find_tokenizer(path: Path, common: dict, notes: list[str]) -> str | None:
    for directory in (path, path.parent) if path.name.startswith("iteration_") else (path,):
        if (directory / "tokenizer.json").is_file():
            return str(directory)
        if (directory / "tokenizer.model").is_file():
            return str(directory / "tokenizer.model")
    train = common.get("train_config")
    if not isinstance(train, dict) or not isinstance(train.get("tokenizer"), dict):
        return None
    recorded = train["tokenizer"].get("path")
    if not recorded or not isinstance(recorded, str):
        return None
    for candidate in (Path(recorded), _from_training_directory(path, train, recorded)):
        if candidate is not None and candidate.exists():
            return str(candidate)
    notes.append(f"the training config's tokenizer.path {recorded} does not exist here")
    return None


def _from_training_directory(path: Path, train: dict, recorded: str) -> Path | None:
    """A relative tokenizer.path resolved against the directory training ran in: the checkpoint
    directory ends with the recorded (relative) save_path, so what precedes it is that directory."""
    if os.path.isabs(recorded):
        return None
    checkpoint = train.get("checkpoint") if isinstance(train.get("checkpoint"), dict) else {}
    save_path = checkpoint.get("save_path") or os.path.join(str(train.get("output_dir") or ""), "checkpoint")
    if not isinstance(save_path, str) or os.path.isabs(save_path):
        return None
    root = path.resolve()
    if root.name.startswith("iteration_"):
        root = root.parent
    tail = Path(os.path.normpath(save_path)).parts
    if not tail or root.parts[-len(tail):] != tail:
        return None
    return Path(*root.parts[:-len(tail)]) / recorded


def read_checkpoint_info(path: str | os.PathLike) -> tuple[str, int | None, dict[str, Any]]:
    """(kind, iteration, common) of a checkpoint without reading any tensor."""
    result = mf_ckpt.load(os.fspath(path), {}, strict=False)
    return result.kind, result.iteration, dict(result.common)


def load_pretrained(path: str | os.PathLike, **overrides: Any) -> Pretrained:
    """Build the checkpoint's model and load its weights; `overrides` replace model keys (e.g.
    compute_dtype="float16"). Raises `mf_ckpt.CheckpointError` or `ModelConfigError` (one line)."""
    path = Path(path)
    kind, iteration, common = read_checkpoint_info(path)
    hf_config = common.get("hf_config")
    if not isinstance(hf_config, dict):
        raise mf_ckpt.CheckpointError(
            f"{path}: the checkpoint does not record its model (no hf_config in common.json); "
            "give a YAML with the model section and checkpoint.load_path instead")
    model = build_model({**hf_config, **overrides}, init=False)
    load_weights(model, path)   # mf_models.weights: the one loader
    notes: list[str] = []
    adapter = mf_ckpt.read_adapter_meta(common, os.fspath(path))
    if adapter is not None:
        notes.append(f"LoRA adapter (rank {adapter['rank']}, {len(adapter.get('modules') or [])} modules) merged "
                     f"into its base {adapter.get('base')}")
    generation = common.get("hf_generation_config") if isinstance(common.get("hf_generation_config"), dict) else {}
    eos = _eos_ids(generation.get("eos_token_id"), hf_config.get("eos_token_id"))
    return Pretrained(model, os.fspath(path), kind, iteration, hf_config, eos, _find_tokenizer(path, common, notes), notes)
