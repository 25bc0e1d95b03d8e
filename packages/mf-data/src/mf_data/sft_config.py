"""`SFTDatasetConfig` and its YAML mapping (`datasets_type: SFTDataset`).

The YAML block has the GPT dataset's shape: `seq_length`, `seed`, `split`, `data_path` (or the
per-split paths), `path_to_cache`, `create_attention_mask`, `create_compressed_eod_mask`,
`eod_pad_length`, ... Keys that describe pretraining behaviour are refused with the reason
rather than ignored: sample boundaries come from the file's documents (`eod` is not needed),
rows are padded with id 0 outside every sample (`pad` is not needed), the loss mask comes from
the data (`eod_mask_loss`), and rows hold whole samples (`add_extra_token_to_sequence`,
`drop_last_partial_validation_sequence`). `reset_position_ids` / `reset_attention_mask` may be
given as true: an SFT dataset always restarts positions, and masks attention, per sample.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .config import BlendedMegatronDatasetConfig, check_bool, check_int
from .loader_config import config_from_dict

_SAME = (
    "sequence_length", "random_seed", "split", "create_attention_mask", "create_compressed_eod_mask", "eod_pad_length",
    "mid_level_dataset_surplus", "num_dataset_builder_threads", "path_to_cache", "mmap_bin_files", "cache_wait_timeout",
)
_REJECTED = {
    "s3_cache_path": "S3 storage is not supported by mf-data: copy the data to a local or shared filesystem",
    "eod": "SFTDataset does not use eod: samples end where the file's documents end (remove it)",
    "pad": "SFTDataset pads rows with id 0 outside every sample and masks the padding from the loss (remove pad)",
    "eod_mask_loss": "SFTDataset takes the loss mask from the data's loss-mask channel (remove it)",
    "add_extra_token_to_sequence": "SFTDataset rows hold whole samples; a label is the next token of the same "
                                   "sample (remove it)",
    "drop_last_partial_validation_sequence": "SFTDataset rows hold whole samples, never a partial one (remove it)",
}
_ALWAYS_TRUE = {
    "reset_position_ids": "SFTDataset always restarts position ids at each packed sample",
    "reset_attention_mask": "SFTDataset always keeps packed samples from attending to each other (when it builds a mask)",
}


@dataclass
class SFTDatasetConfig(BlendedMegatronDatasetConfig):
    """Settings of `SFTDataset`: which columns to build besides the four basic ones.

    `create_attention_mask` (default True, as for GPT) adds the block-diagonal causal mask,
    `create_compressed_eod_mask` the `actual_seq_len` column, padded to `eod_pad_length`
    entries; a row holds at most `eod_pad_length - 1` samples so that every boundary fits.
    """

    create_attention_mask: bool = True
    create_compressed_eod_mask: bool = False
    eod_pad_length: int = 128

    def __post_init__(self) -> None:
        super().__post_init__()
        check_bool("create_attention_mask", self.create_attention_mask)
        check_bool("create_compressed_eod_mask", self.create_compressed_eod_mask)
        check_int("eod_pad_length", self.eod_pad_length, 2)

    @property
    def max_samples_per_row(self) -> int:
        """Room for every sample's end offset plus the row's end in `actual_seq_len`."""
        return self.eod_pad_length - 1


def sft_config_from_dict(values: Mapping[str, Any], where: str = "config") -> SFTDatasetConfig:
    """Build an `SFTDatasetConfig` from the YAML's `dataloader.config` keys; errors name `where.<key>`."""
    return config_from_dict(SFTDatasetConfig, _SAME, _REJECTED, values, where, always_true=_ALWAYS_TRUE)
