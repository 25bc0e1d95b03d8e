"""The tokenizer a checkpoint carries, in every kind of directory mf-ckpt reads or writes.

- mf checkpoint: assets under `iteration_N/tokenizer/` (checksummed in metadata.json), e.g.
  `tokenizer.model` + `tokenizer_config.json` for a sentencepiece model, or `tokenizer.json` (+
  `tokenizer_config.json`, chat template, ...) for a Hugging Face tokenizer. mf-trainer writes
  them with every checkpoint; `convert --from hf` copies them from the HF directory.
- merged directory: `tokenizer/` beside model.safetensors (checksummed in its common.json).
- Hugging Face directory: the tokenizer files beside config.json, as transformers saves them;
  `convert --to hf` writes them there (and `model_max_length` into tokenizer_config.json).

The files are the ones transformers' `AutoTokenizer.from_pretrained` reads, so `tokenizer/` is
itself a tokenizer directory; `CarriedTokenizer.path` is what mf-data's `load_tokenizer` takes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import assets
from .errors import CheckpointError
from .fsutil import loads_json
from .layout import CheckpointLayout
from .sentencepiece_json import config_bytes, sentencepiece_tokenizer_json

TOKENIZER_DIR = "tokenizer"

# What transformers saves for a tokenizer (and reads back), whatever its kind.
HF_TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "chat_template.jinja", "chat_template.json", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model",
    "vocab.json", "merges.txt", "vocab.txt",
)


@dataclass(frozen=True)
class CarriedTokenizer:
    """A tokenizer found with a checkpoint: its directory and files (checked against their
    checksums where the checkpoint records them)."""

    directory: Path
    files: dict[str, Path] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return "hf" if "tokenizer.json" in self.files else "sentencepiece"

    @property
    def path(self) -> str:
        """What mf_data.load_tokenizer takes: the directory of an HF tokenizer, the .model file otherwise."""
        if self.kind == "hf":
            return str(self.directory)
        return str(self.files.get("tokenizer.model") or next(iter(self.files.values())))


def tokenizer_assets(files: Mapping[str, Any]) -> dict[str, Any]:
    """`Saver.save(assets=...)` for a tokenizer: {file name: bytes or path} -> {"tokenizer/<name>": ...}."""
    out = {}
    for name, value in files.items():
        if name not in HF_TOKENIZER_FILES:
            raise CheckpointError(f"tokenizer file {name!r} is not one transformers reads "
                                  f"({', '.join(HF_TOKENIZER_FILES)})")
        out[f"{TOKENIZER_DIR}/{name}"] = value
    return out


def hf_tokenizer_files(directory: str | os.PathLike) -> dict[str, Path]:
    """The tokenizer files of a Hugging Face directory ({} when it has none)."""
    root = Path(directory)
    return {name: root / name for name in HF_TOKENIZER_FILES if (root / name).is_file()}


def _usable(files: Mapping[str, Any]) -> bool:
    return "tokenizer.json" in files or "tokenizer.model" in files


def tokenizer_of(layout: CheckpointLayout) -> CarriedTokenizer | None:
    """The tokenizer `layout` carries, checksums checked (mf and merged directories), or None."""
    if layout.kind == "hf":
        files = hf_tokenizer_files(layout.root)
        return CarriedTokenizer(layout.root, files) if _usable(files) else None
    records = assets.in_directory(layout.info.get("assets", {}), TOKENIZER_DIR)
    if not _usable(records):
        return None
    for record in records.values():
        assets.read(layout.root, record)
    directory = layout.root / TOKENIZER_DIR
    return CarriedTokenizer(directory, {name: directory / name for name in sorted(records)})


def tokenizer_bytes(layout: CheckpointLayout) -> dict[str, bytes]:
    """{file name: bytes} of the tokenizer `layout` carries (checked), to copy into an output."""
    if layout.kind == "hf":
        return {name: path.read_bytes() for name, path in hf_tokenizer_files(layout.root).items()}
    records = assets.in_directory(layout.info.get("assets", {}), TOKENIZER_DIR)
    return {name: assets.read(layout.root, record) for name, record in sorted(records.items())}


def find_tokenizer(path: str | os.PathLike, iteration: int | None = None) -> CarriedTokenizer | None:
    """The tokenizer a checkpoint directory (any kind `load` accepts) carries, or None."""
    from .sources import open_source

    return tokenizer_of(open_source(path, iteration))


def hf_export_files(files: Mapping[str, bytes], hf_config: Mapping[str, Any], where: str) -> dict[str, bytes]:
    """The tokenizer files of an HF export: as carried, with `model_max_length` in
    tokenizer_config.json (the model's max_position_embeddings) when the tokenizer does not say.

    A sentencepiece tokenizer (tokenizer.model without tokenizer.json, what mf-trainer carries)
    gains a tokenizer.json that encodes and decodes as sentencepiece does, and a
    tokenizer_config.json naming `PreTrainedTokenizerFast`, the class every transformers version
    loads it with as it is (see sentencepiece_json); tokenizer.model stays beside it for tools
    that read sentencepiece itself."""
    out = dict(files)
    config: dict[str, Any] | None = None
    before = None
    if "tokenizer_config.json" in out:
        config = loads_json(out["tokenizer_config.json"], f"{where}/{TOKENIZER_DIR}/tokenizer_config.json",
                            "tokenizer_config.json")
        if not isinstance(config, dict):
            raise CheckpointError(f"{where}/{TOKENIZER_DIR}/tokenizer_config.json: must be a JSON object")
        before = dict(config)
    if "tokenizer.model" in out and "tokenizer.json" not in out:
        exported = sentencepiece_tokenizer_json(out["tokenizer.model"], f"{where}/{TOKENIZER_DIR}/tokenizer.model")
        out["tokenizer.json"] = exported.tokenizer_json
        # the carried config's other keys (chat template, model_max_length, ...) stay; the keys that
        # say how to load and encode are the exported tokenizer's
        config = {**(config or {}), **exported.config}
        config.pop("auto_map", None)
    limit = hf_config.get("max_position_embeddings")
    if config is not None and config.get("model_max_length") is None and isinstance(limit, int) \
            and not isinstance(limit, bool):
        config["model_max_length"] = limit
    if config is not None and config != before:      # a config left as it is keeps its bytes
        out["tokenizer_config.json"] = config_bytes(config)
    return out


def write_files(directory: Path, files: Mapping[str, bytes]) -> list[str]:
    """Write tokenizer files into an output directory being built (an HF export)."""
    for name, data in files.items():
        (Path(directory) / name).write_bytes(data)
    return sorted(files)
