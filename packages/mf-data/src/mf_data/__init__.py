"""Megatron-compatible datasets for any training stack: numpy only, no framework import.

Formats and datasets keep Megatron-Core's names, so `from megatron.core.datasets... import X`
becomes `from mf_data import X`. Index arrays and samples are identical to Megatron-Core 0.16's
for the same inputs. Supervised fine-tuning data (chat jsonl -> tokens + a loss-mask channel ->
packed rows) is `preprocess_sft` / `SFTDataset`, served by the same loader.
"""

from .blended_dataset import BlendedDataset
from .builder import BlendedMegatronDatasetBuilder
from .chat import Conversation, SFTKeys, conversation_from_json
from .chat_template import BUILTIN_TEMPLATE_DOC
from .config import BlendedMegatronDatasetConfig, GPTDatasetConfig
from .demo_corpus import make_demo_corpus
from .demo_sft import make_demo_sft
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
from .hf_tokenizer import HFTokenizer
from .indexed_dataset import (
    DType,
    IndexedDataset,
    IndexedDatasetBuilder,
    TokenRange,
    get_bin_path,
    get_idx_path,
    get_stats_path,
    token_range,
)
from .loader import BlendedMegatronDatasetDataLoader, build_from_yaml_block
from .loader_config import gpt_config_from_dict
from .preprocess import preprocess
from .sampler import MegatronPretrainingSampler
from .samples import COLUMNS, flatten_actual_seq_len
from .sft_config import SFTDatasetConfig, sft_config_from_dict
from .sft_dataset import SFTDataset
from .sft_encode import ChatEncoder, load_tokenizer
from .sft_indexed import SFTIndexedDataset, loss_mask_prefix
from .sft_preprocess import preprocess_sft, sft_output_prefix
from .summary import summarize
from .tokenizer import SentencePieceTokenizer, train_sentencepiece
from .tokenizer_files import tokenizer_files
from .utils import Split, get_blend_from_list, parse_and_normalize_split

__version__ = "0.5.0"

__all__ = [
    "BUILTIN_TEMPLATE_DOC",
    "COLUMNS",
    "BlendedDataset",
    "BlendedMegatronDatasetBuilder",
    "BlendedMegatronDatasetConfig",
    "BlendedMegatronDatasetDataLoader",
    "CacheTimeoutError",
    "ChatEncoder",
    "Conversation",
    "DType",
    "DataFileError",
    "DataFileNotFoundError",
    "DatasetConfigError",
    "DatasetTooSmallError",
    "GPTDataset",
    "GPTDatasetConfig",
    "HFTokenizer",
    "IndexedDataset",
    "IndexedDatasetBuilder",
    "InputError",
    "MFDataError",
    "MegatronPretrainingSampler",
    "SFTDataset",
    "SFTDatasetConfig",
    "SFTIndexedDataset",
    "SFTKeys",
    "TokenRange",
    "SentencePieceTokenizer",
    "Split",
    "__version__",
    "build_from_yaml_block",
    "conversation_from_json",
    "flatten_actual_seq_len",
    "get_bin_path",
    "get_blend_from_list",
    "get_idx_path",
    "get_stats_path",
    "gpt_config_from_dict",
    "load_tokenizer",
    "loss_mask_prefix",
    "make_demo_corpus",
    "make_demo_sft",
    "parse_and_normalize_split",
    "preprocess",
    "preprocess_sft",
    "sft_config_from_dict",
    "sft_output_prefix",
    "summarize",
    "token_range",
    "tokenizer_files",
    "train_sentencepiece",
]
