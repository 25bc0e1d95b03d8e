"""Checks of the Megatron loader's pass-through keys (`BlendedMegatronDatasetDataLoader`).

`dataloader` is an allow_extra section, so its undeclared keys are not schema fields. For the
Megatron loader, though, the reference documents them (datasets_type, sizes, config.seq_length,
config.split, config.data_path, ...), and mistakes there otherwise surface deep inside a run:
when such a key is present its shape is checked here. Other loaders' keys pass through untouched.
"""

from __future__ import annotations

import math
from typing import Any

from mf_config.errors import ConfigError

MEGATRON_LOADER = "BlendedMegatronDatasetDataLoader"
# The columns a Megatron GPT sample can carry (mf-data produces exactly these).
MEGATRON_COLUMNS = ("input_ids", "labels", "loss_mask", "position_ids", "attention_mask", "actual_seq_len")
_BOOL_KEYS = ("create_attention_mask", "create_compressed_eod_mask", "reset_position_ids",
              "reset_attention_mask", "eod_mask_loss", "add_extra_token_to_sequence")
_INT_KEYS = ("eod", "pad")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> float | None:
    """A weight: a number or a numeric string such as '0.3' (the reference quotes them)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def split_data_path(data_path: Any, key_path: str) -> tuple[list[str], list[float] | None]:
    """(prefixes, weights) of a Megatron `data_path` list, read the way Megatron-Core reads it:
    an even-length list whose every other entry (from the first) is a number is `[weight, prefix,
    weight, prefix, ...]`; otherwise every entry is a prefix. Weights may be quoted ('1')."""
    if not isinstance(data_path, list) or not data_path:
        raise ConfigError(key_path, "must be a non-empty list of prefixes, or of weight, prefix pairs", data_path)
    weights: list[float] | None = None
    prefixes: list[Any] = data_path
    if len(data_path) % 2 == 0:
        parsed = [_number(v) for v in data_path[0::2]]
        if all(w is not None for w in parsed):
            weights, prefixes = parsed, data_path[1::2]
        elif any(w is not None for w in parsed):
            bad = next(2 * i for i, w in enumerate(parsed) if w is None)
            raise ConfigError(f"{key_path}[{bad}]", "expected a weight: weights and prefixes must alternate",
                              data_path[bad])
    step, offset = (2, 1) if weights is not None else (1, 0)
    for i, prefix in enumerate(prefixes):
        if not isinstance(prefix, str) or not prefix.strip():
            raise ConfigError(f"{key_path}[{i * step + offset}]", "a dataset prefix must be a non-empty string", prefix)
    if weights is not None:
        for i, w in enumerate(weights):
            if not math.isfinite(w) or w < 0:
                raise ConfigError(f"{key_path}[{2 * i}]", "a weight must be a finite number >= 0", data_path[2 * i])
        if sum(weights) <= 0:
            raise ConfigError(key_path, "the weights must not all be zero", data_path)
    return [p.strip() for p in prefixes], weights


def _check_split(value: Any, path: str) -> None:
    if not isinstance(value, str):
        raise ConfigError(path, "must be a string of up to three comma-separated weights such as '969,30,1'", value)
    parts = [p.strip() for p in value.split(",")]
    numbers = [_number(p) for p in parts]
    if not 1 <= len(parts) <= 3 or any(n is None or not math.isfinite(n) or n < 0 for n in numbers):
        raise ConfigError(path, "must be up to three comma-separated non-negative numbers such as '969,30,1'", value)
    if sum(numbers) <= 0:
        raise ConfigError(path, "must give a positive weight to at least one split", value)


def _check_config(config: Any, path: str, model) -> None:
    if not isinstance(config, dict):
        raise ConfigError(path, "must be a mapping (the dataset's settings)", config)
    if "seq_length" in config:
        seq = config["seq_length"]
        if not _is_int(seq) or seq <= 0:
            raise ConfigError(f"{path}.seq_length", "must be a positive integer", seq)
        model_seq = model.extra.get("seq_length")
        if _is_int(model_seq) and seq > model_seq:
            raise ConfigError(f"{path}.seq_length", f"must not exceed model.seq_length ({model_seq})", seq)
    if "split" in config:
        _check_split(config["split"], f"{path}.split")
    for key in _INT_KEYS:
        if key in config and not _is_int(config[key]):
            raise ConfigError(f"{path}.{key}", "must be an integer token id", config[key])
    for key in _BOOL_KEYS:
        if key in config and not isinstance(config[key], bool):
            raise ConfigError(f"{path}.{key}", "must be a boolean (True/False)", config[key])
    if "data_path" in config:
        split_data_path(config["data_path"], f"{path}.data_path")


def check_dataloader(dataloader, path: str, model) -> None:
    """Shape checks of the Megatron loader's documented pass-through keys (no-op for others)."""
    if dataloader.type != MEGATRON_LOADER:
        return
    for i, name in enumerate(dataloader.column_names):
        if name not in MEGATRON_COLUMNS:
            raise ConfigError(f"{path}.column_names[{i}]",
                              f"is not a column the Megatron loader produces ({', '.join(MEGATRON_COLUMNS)})", name)
    extra = dataloader.extra
    if "datasets_type" in extra and (not isinstance(extra["datasets_type"], str) or not extra["datasets_type"]):
        raise ConfigError(f"{path}.datasets_type", "must be a dataset class name such as 'GPTDataset'",
                          extra["datasets_type"])
    if "sizes" in extra:
        sizes = extra["sizes"]
        if (not isinstance(sizes, list) or len(sizes) != 3
                or any(not _is_int(s) or s < 0 for s in sizes)):
            raise ConfigError(f"{path}.sizes", "must be three non-negative sample counts [train, valid, test]", sizes)
    if "config" in extra:
        _check_config(extra["config"], f"{path}.config", model)


def dataloader_prefixes(dataloader) -> list[str]:
    """The dataset prefixes a Megatron loader will open (for path warnings); [] for other loaders."""
    if dataloader.type != MEGATRON_LOADER:
        return []
    config = dataloader.extra.get("config")
    if not isinstance(config, dict) or "data_path" not in config:
        return []
    return split_data_path(config["data_path"], "data_path")[0]
