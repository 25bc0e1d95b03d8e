"""Dataset configuration dataclasses, named and shaped like Megatron-Core's.

`GPTDatasetConfig(random_seed=..., sequence_length=..., blend=([...], [...]), split="969,30,1",
...)` takes the same field names as `megatron.core.datasets.gpt_dataset.GPTDatasetConfig` for
everything mf-data implements. Differences, each for a reason:

* no `tokenizer` is needed: `eod` and `pad` are plain ids (a tokenizer object with `.eod` and
  `.pad` may still be passed and fills them in);
* `reset_position_ids`, `reset_attention_mask` and `eod_mask_loss` default to False;
* `create_compressed_eod_mask` / `eod_pad_length` (MindFormers) add the `actual_seq_len` column;
* `cache_wait_timeout`: how long a rank that does not build the index cache waits for it;
* Megatron-only switches (mock data, S3/MSC storage, fast cache load, deferred mmap) are absent.

Everything is validated on construction, with errors naming the field and the value.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from .errors import DatasetConfigError
from .utils import Split, check_weights, convert_split_vector_to_split_matrix, parse_and_normalize_split

Blend = tuple[list[str], "list[float] | None"]


def _check_blend(blend: Any, where: str) -> tuple[list[str], list[float] | None]:
    if not isinstance(blend, (tuple, list)) or len(blend) != 2:
        raise DatasetConfigError(f"{where} must be a pair (prefixes, weights or None), got {blend!r}")
    prefixes, weights = blend
    if isinstance(prefixes, str) or not isinstance(prefixes, (list, tuple)) or not prefixes:
        raise DatasetConfigError(f"{where}: the prefixes must be a non-empty list of paths, got {prefixes!r}")
    for p in prefixes:
        if not isinstance(p, (str, os.PathLike)) or not os.fspath(p):
            raise DatasetConfigError(f"{where}: dataset prefix {p!r} is not a path")
    prefixes = [os.fspath(p) for p in prefixes]
    if weights is not None:
        if isinstance(weights, (str, bytes)) or not isinstance(weights, (list, tuple)):
            raise DatasetConfigError(f"{where}: weights must be a list of numbers or None, got {weights!r}")
        check_weights(prefixes, list(weights), where)
        weights = [float(w) for w in weights]
    return prefixes, weights


def check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DatasetConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")


def check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise DatasetConfigError(f"{name} must be true or false, got {value!r}")


@dataclass
class BlendedMegatronDatasetConfig:
    """What to read and how to split it; shared by every dataset type."""

    random_seed: int
    sequence_length: int
    blend: Blend | None = None
    blend_per_split: list[Blend | None] | None = None
    split: str | None = None
    split_matrix: list[tuple[float, float] | None] | None = field(init=False, default=None)
    num_dataset_builder_threads: int = 1
    path_to_cache: str | None = None
    mmap_bin_files: bool = True
    mid_level_dataset_surplus: float = 0.005
    cache_wait_timeout: float = 600.0

    def __post_init__(self) -> None:
        check_int("random_seed", self.random_seed, 0)
        if self.random_seed >= 2**32:
            raise DatasetConfigError(f"random_seed must be below 2**32 (a numpy RandomState seed), got {self.random_seed}")
        check_int("sequence_length", self.sequence_length, 1)
        check_int("num_dataset_builder_threads", self.num_dataset_builder_threads, 1)
        check_bool("mmap_bin_files", self.mmap_bin_files)
        s = self.mid_level_dataset_surplus
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s < 0:
            raise DatasetConfigError(f"mid_level_dataset_surplus must be a finite number >= 0, got {s!r}")
        t = self.cache_wait_timeout
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
            raise DatasetConfigError(f"cache_wait_timeout must be a number of seconds > 0, got {t!r}")
        if self.path_to_cache is not None:
            if not isinstance(self.path_to_cache, (str, os.PathLike)) or not os.fspath(self.path_to_cache):
                raise DatasetConfigError(f"path_to_cache must be a directory path, got {self.path_to_cache!r}")
            self.path_to_cache = os.fspath(self.path_to_cache)

        per_split = self.blend_per_split is not None and any(b is not None for b in self.blend_per_split)
        if per_split:
            if self.blend is not None:
                raise DatasetConfigError("blend and blend_per_split are mutually exclusive; give one")
            if self.split is not None:
                raise DatasetConfigError("split applies to blend only; with blend_per_split each split has its own data")
            if len(self.blend_per_split) != len(Split):
                raise DatasetConfigError(f"blend_per_split needs {len(Split)} entries (train, valid, test), got {len(self.blend_per_split)}")
            self.blend_per_split = [
                None if b is None else _check_blend(b, f"blend_per_split[{s.name}]")
                for b, s in zip(self.blend_per_split, Split)
            ]
            self.split_matrix = None
        else:
            if self.blend is None:
                raise DatasetConfigError("no data: give blend (a data_path) or blend_per_split")
            self.blend = _check_blend(self.blend, "blend")
            if self.split is None:
                raise DatasetConfigError("split must be given with blend, e.g. '969,30,1'")
            self.split_matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(self.split))


@dataclass
class GPTDatasetConfig(BlendedMegatronDatasetConfig):
    """Settings of `GPTDataset`: sample layout, masks and special token ids."""

    reset_position_ids: bool = False
    reset_attention_mask: bool = False
    eod_mask_loss: bool = False
    create_attention_mask: bool = True
    create_compressed_eod_mask: bool = False
    eod_pad_length: int = 128
    drop_last_partial_validation_sequence: bool = True
    add_extra_token_to_sequence: bool = True
    eod: int | None = None
    pad: int | None = None
    tokenizer: Any = None

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in (
            "reset_position_ids", "reset_attention_mask", "eod_mask_loss", "create_attention_mask",
            "create_compressed_eod_mask", "drop_last_partial_validation_sequence", "add_extra_token_to_sequence",
        ):
            check_bool(name, getattr(self, name))
        check_int("eod_pad_length", self.eod_pad_length, 1)
        if self.tokenizer is not None:
            if self.eod is None:
                self.eod = getattr(self.tokenizer, "eod", None)
            if self.pad is None:
                self.pad = getattr(self.tokenizer, "pad", None)
        if self.pad is None:
            self.pad = -1  # Megatron's id for "no pad token": never present in uint16 data
        for name in ("eod", "pad"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise DatasetConfigError(f"{name} must be an integer token id, got {value!r}")
        needs_eod = [
            n for n in ("reset_position_ids", "reset_attention_mask", "eod_mask_loss", "create_compressed_eod_mask")
            if getattr(self, n)
        ]
        if needs_eod and self.eod is None:
            raise DatasetConfigError(f"{needs_eod[0]} needs the end-of-document id: set eod")
        if self.eod is not None and self.pad == self.eod:
            raise DatasetConfigError(
                f"pad ({self.pad}) equals eod: every end-of-document token would be treated as padding "
                "(its loss masked and its id zeroed); use a distinct pad id, e.g. -1"
            )
        if self.reset_attention_mask and not (self.create_attention_mask or self.create_compressed_eod_mask):
            raise DatasetConfigError(
                "reset_attention_mask only shapes an attention mask: set create_attention_mask or "
                "create_compressed_eod_mask too (or drop reset_attention_mask)"
            )
