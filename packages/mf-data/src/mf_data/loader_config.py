"""From the YAML `train_dataset.dataloader.config` mapping to a `GPTDatasetConfig` (or, through
`config_from_dict`, another dataset's config).

The YAML uses MindFormers' names (`seq_length`, `seed`, `data_path: [weight, prefix, ...]`);
the dataclass uses Megatron's. Every key is either mapped to a field or rejected with a
did-you-mean hint: a typo never silently falls back to a default.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from .config import BlendedMegatronDatasetConfig, GPTDatasetConfig
from .errors import DatasetConfigError, MFDataError
from .utils import get_blend_from_list

# YAML key -> GPTDatasetConfig field (identity for the fields that share their Megatron name).
_RENAMED = {"seq_length": "sequence_length", "seed": "random_seed"}
_SAME = (
    "sequence_length", "random_seed", "split", "eod", "pad", "reset_position_ids", "reset_attention_mask",
    "eod_mask_loss", "create_attention_mask", "create_compressed_eod_mask", "eod_pad_length",
    "add_extra_token_to_sequence", "drop_last_partial_validation_sequence", "mid_level_dataset_surplus",
    "num_dataset_builder_threads", "path_to_cache", "mmap_bin_files", "cache_wait_timeout",
)
_BLEND_KEYS = ("data_path", "train_data_path", "valid_data_path", "test_data_path")
_REJECTED = {
    "s3_cache_path": "S3 storage is not supported by mf-data: copy the data to a local or shared filesystem",
}
DEFAULT_SEED = 1234  # MindFormers' default for `seed`
KNOWN_KEYS = tuple(sorted({*_RENAMED, *_SAME, *_BLEND_KEYS, *_REJECTED}))


def suggest(key: str, known: Any) -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def gpt_config_from_dict(values: Mapping[str, Any], where: str = "config") -> GPTDatasetConfig:
    """Build a `GPTDatasetConfig` from YAML-style keys; errors name `where.<key>`."""
    return config_from_dict(GPTDatasetConfig, _SAME, _REJECTED, values, where)


def config_from_dict(
    cls: type[BlendedMegatronDatasetConfig],
    same: tuple[str, ...],
    rejected: Mapping[str, str],
    values: Mapping[str, Any],
    where: str,
    always_true: Mapping[str, str] | None = None,
) -> Any:
    """`cls` from YAML-style keys: `same` are field names used as they are, `rejected` keys are
    errors (with the reason given) unless null, `always_true` keys describe fixed behaviour (the
    reason says which) and may only be true; anything else unknown is an error with a did-you-mean
    hint."""
    always_true = always_true or {}
    if not isinstance(values, Mapping):
        raise DatasetConfigError(f"{where} must be a mapping, got {type(values).__name__}")
    known = tuple(sorted({*_RENAMED, *same, *_BLEND_KEYS, *rejected, *always_true}))
    fields: dict[str, Any] = {}
    for key, value in values.items():
        if not isinstance(key, str) or key not in known:
            raise DatasetConfigError(f"{where}.{key}: unknown key{suggest(str(key), known)}")
        if key in rejected:
            if value is not None:
                raise DatasetConfigError(f"{where}.{key}: {rejected[key]}")
            continue
        if key in always_true:
            if value not in (None, True):
                raise DatasetConfigError(f"{where}.{key}: {always_true[key]}; it cannot be {value!r}")
            continue
        if key in _BLEND_KEYS:
            continue
        target = _RENAMED.get(key, key)
        if target in fields:
            if fields[target] != value:
                raise DatasetConfigError(f"{where}.{key}: conflicts with another spelling of {target} ({fields[target]!r})")
            continue
        if value is None and target in ("mmap_bin_files",):
            continue  # MindFormers passes None for "default"
        fields[target] = value
    if "sequence_length" not in fields:
        raise DatasetConfigError(f"{where}.seq_length: required (the number of tokens per sample)")
    fields.setdefault("random_seed", DEFAULT_SEED)
    try:
        if values.get("data_path") is not None:
            fields["blend"] = get_blend_from_list(values["data_path"])
        per_split = [get_blend_from_list(values.get(k)) for k in ("train_data_path", "valid_data_path", "test_data_path")]
        if any(b is not None for b in per_split):
            fields["blend_per_split"] = per_split
    except MFDataError as err:
        raise DatasetConfigError(f"{where}.data_path: {err}") from None
    try:
        return cls(**fields)
    except MFDataError as err:
        raise DatasetConfigError(f"{where}: {_yaml_names(str(err))}") from None


def _yaml_names(message: str) -> str:
    """Speak the YAML's names in messages about the dataclass fields."""
    for yaml_key, field in _RENAMED.items():
        message = message.replace(field, yaml_key)
    return message
