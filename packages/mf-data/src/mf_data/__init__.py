"""Megatron-compatible datasets for any training stack: numpy only, no framework import.

Formats and datasets keep Megatron-Core's names, so `from megatron.core.datasets... import X`
becomes `from mf_data import X`. Index arrays and samples are identical to Megatron-Core 0.16's
for the same inputs.
"""

from .blended_dataset import BlendedDataset
from .builder import BlendedMegatronDatasetBuilder
from .config import BlendedMegatronDatasetConfig, GPTDatasetConfig
from .errors import (
    CacheTimeoutError,
    DataFileError,
    DataFileNotFoundError,
    DatasetConfigError,
    DatasetTooSmallError,
    InputError,
    MFDataError,
)
from .gpt_dataset import GPTDataset
from .indexed_dataset import DType, IndexedDataset, IndexedDatasetBuilder, get_bin_path, get_idx_path
from .samples import COLUMNS, flatten_actual_seq_len
from .utils import Split, get_blend_from_list, parse_and_normalize_split

__version__ = "0.1.0"

__all__ = [
    "COLUMNS",
    "BlendedDataset",
    "BlendedMegatronDatasetBuilder",
    "BlendedMegatronDatasetConfig",
    "CacheTimeoutError",
    "DType",
    "DataFileError",
    "DataFileNotFoundError",
    "DatasetConfigError",
    "DatasetTooSmallError",
    "GPTDataset",
    "GPTDatasetConfig",
    "IndexedDataset",
    "IndexedDatasetBuilder",
    "InputError",
    "MFDataError",
    "Split",
    "__version__",
    "flatten_actual_seq_len",
    "get_bin_path",
    "get_blend_from_list",
    "get_idx_path",
    "parse_and_normalize_split",
]
