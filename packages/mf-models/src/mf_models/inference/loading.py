"""A model ready to generate from a checkpoint directory, with what the directory says about it.

`load_pretrained(path)` takes anything mf-ckpt loads: a Hugging Face directory (config.json +
safetensors), an mf save directory (its latest committed iteration) or one iteration directory, a
merged directory, or a LoRA adapter checkpoint (merged on load into the base it records). The
architecture comes from the checkpoint itself (`config.json`, or the `hf_config` mf-trainer stores
in common.json), so no YAML is needed; the stored tensors' shapes are compared with it before the
model is built (a crafted config cannot make us allocate first). Also reported:
- the tokenizer the checkpoint carries (`iteration_N/tokenizer/`, checksummed, or the files beside
  an HF directory's config.json; an adapter without one: its base's), else, for checkpoints written
  before tokenizers were carried, the training YAML's `tokenizer.path` recorded in common.json when
  that file still exists;
- the generation config (HF's generation_config.json, or `hf_generation_config` in common.json) and
  its EOS ids (then config.json's);
- a model id for servers: the directory's name, or for a generic one (`checkpoint`, an
  `iteration_N`) the run's name (its output_dir), else the parent directory's name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mf_ckpt

from ..common.transformer import CausalLM
from ..registry import build_model
from ..weights import check_weights_fit, load_weights

# Directory names that say nothing about the model in them.
GENERIC_NAMES = {"checkpoint", "checkpoints", "ckpt", "ckpts", "hf", "merged", "weights", "model", "export"}


@dataclass
class Pretrained:
    model: CausalLM
    path: str
    kind: str                       # "hf", "mf" or "safetensors" (mf-ckpt's source kinds)
    iteration: int | None
    hf_config: dict[str, Any]
    eos_token_ids: list[int]
    tokenizer_path: str | None      # found with the checkpoint (or given), if any
    notes: list[str] = field(default_factory=list)
    generation_config: dict[str, Any] = field(default_factory=dict)
    name: str = "model"             # a model id for servers (see model_name)


def _eos_ids(*values: Any) -> list[int]:
    for value in values:
        if value is None:
            continue
        ids = value if isinstance(value, list) else [value]
        if all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            return [int(t) for t in ids]
    return []


def model_name(path: str | os.PathLike, common: dict) -> str:
    """The id a server gives the model at `path` (see the module docstring)."""
    base = Path(os.path.abspath(path))
    if base.name.startswith(("iteration_", ".iteration_")):
        base = base.parent
    if base.name and base.name.lower() not in GENERIC_NAMES:
        return base.name
    train = common.get("train_config")
    output_dir = train.get("output_dir") if isinstance(train, dict) else None
    if isinstance(output_dir, str) and "\x00" not in output_dir and os.path.basename(os.path.normpath(output_dir)):
        return os.path.basename(os.path.normpath(output_dir))
    return base.parent.name or base.name or "model"


def _recorded_tokenizer(path: Path, common: dict, notes: list[str]) -> str | None:
    """The training YAML's tokenizer.path recorded in common.json, if it still exists (checkpoints
    written before tokenizers were carried). A value that is no file name is one error line."""
    train = common.get("train_config")
    if not isinstance(train, dict) or not isinstance(train.get("tokenizer"), dict):
        return None
    recorded = train["tokenizer"].get("path")
    if not recorded:
        return None
    if not isinstance(recorded, str) or "\x00" in recorded:
        shown = "holds a NUL byte" if isinstance(recorded, str) else f"is a {type(recorded).__name__}"
        raise mf_ckpt.CheckpointError(f"{path}: common.json train_config.tokenizer.path {shown}, not a file name; "
                                      "give the tokenizer with --tokenizer")
    for candidate in (Path(recorded), _from_training_directory(path, train, recorded)):
        if candidate is not None and os.path.exists(candidate):
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
    if not isinstance(save_path, str) or "\x00" in save_path or os.path.isabs(save_path):
        return None
    root = path.resolve()
    if root.name.startswith("iteration_"):
        root = root.parent
    tail = Path(os.path.normpath(save_path)).parts
    if not tail or root.parts[-len(tail):] != tail:
        return None
    return Path(*root.parts[:-len(tail)]) / recorded


def find_tokenizer(path: str | os.PathLike, common: dict, notes: list[str] | None = None) -> str | None:
    """The tokenizer of the checkpoint at `path` (whose common.json is `common`), for mf-data's
    load_tokenizer, or None. Carried files are checked against their checksums."""
    notes = notes if notes is not None else []
    carried = mf_ckpt.find_tokenizer(path)
    if carried is not None:
        return carried.path
    adapter = mf_ckpt.read_adapter_meta(common, os.fspath(path))
    if adapter is not None and adapter.get("base") and os.path.exists(adapter["base"]):
        iteration = adapter.get("base_iteration") if adapter.get("base_kind") == "mf" else None
        carried = mf_ckpt.find_tokenizer(adapter["base"], iteration)
        if carried is not None:
            return carried.path
    return _recorded_tokenizer(Path(path), common, notes)


def read_checkpoint_info(path: str | os.PathLike) -> tuple[str, int | None, dict[str, Any]]:
    """(kind, iteration, common) of a checkpoint without reading any tensor."""
    result = mf_ckpt.load(os.fspath(path), {}, strict=False)
    return result.kind, result.iteration, dict(result.common)


def load_pretrained(path: str | os.PathLike, *, tokenizer: str | None = None, **overrides: Any) -> Pretrained:
    """Build the checkpoint's model and load its weights; `overrides` replace model keys (e.g.
    compute_dtype="float16"); `tokenizer` is used instead of looking for one. Raises
    `mf_ckpt.CheckpointError` or `ModelConfigError` (one line)."""
    path = Path(path)
    kind, iteration, common = read_checkpoint_info(path)
    hf_config = common.get("hf_config")
    if not isinstance(hf_config, dict):
        raise mf_ckpt.CheckpointError(
            f"{path}: the checkpoint does not record its model (no hf_config in common.json); "
            "give a YAML with the model section and checkpoint.load_path instead")
    section = {**hf_config, **overrides}
    check_weights_fit(section, path, config_name="config.json" if kind == "hf" else "the hf_config in common.json")
    model = build_model(section, init=False)
    load_weights(model, path)   # mf_models.weights: the one loader
    notes: list[str] = []
    adapter = mf_ckpt.read_adapter_meta(common, os.fspath(path))
    if adapter is not None:
        notes.append(f"LoRA adapter (rank {adapter['rank']}, {len(adapter.get('modules') or [])} modules) merged "
                     f"into its base {adapter.get('base')}")
    generation = common.get("hf_generation_config") if isinstance(common.get("hf_generation_config"), dict) else {}
    eos = _eos_ids(generation.get("eos_token_id"), hf_config.get("eos_token_id"))
    found = tokenizer if tokenizer is not None else find_tokenizer(path, common, notes)
    return Pretrained(model, os.fspath(path), kind, iteration, hf_config, eos, found, notes, dict(generation),
                      model_name(path, common))
