"""Sharded safetensors checkpoints: save, reshard-on-load, inspect, merge, Hugging Face conversion, LoRA merging.

Depends on numpy and safetensors only (tqdm for progress bars); never on MindSpore.
"""

from .ckpt_dir import committed_checkpoint
from .collectives import Collective, RankFailed, SingleProcess, ThreadedWorld, exchange_bytes, run_threaded
from .dtypes import BF16, bf16_from_float32, to_float32
from .errors import CheckpointError
from .hf import hf_to_mf, load_hf_state, mf_to_hf, save_hf, supported_model_types
from .inspection import check_config_shapes, stored_tensors
from .loader import LoadResult, load
from .lora import (
    load_lora_adapter,
    load_lora_merged_state,
    make_lora_adapter_meta,
    merge_lora,
    read_adapter_meta,
)
from .lora_tools import merge_lora_checkpoint
from .options import LoadOptions, SaveOptions
from .saver import Saver, SaveResult, save
from .sharding import ShardedTensor, replicated, shard_array, split_evenly, split_padded, split_sizes
from .tokenizer_files import (
    HF_TOKENIZER_FILES,
    TOKENIZER_DIR,
    CarriedTokenizer,
    find_tokenizer,
    hf_tokenizer_files,
    tokenizer_assets,
)

__version__ = "0.5.0"

__all__ = [
    "BF16",
    "CarriedTokenizer",
    "CheckpointError",
    "Collective",
    "HF_TOKENIZER_FILES",
    "LoadOptions",
    "LoadResult",
    "RankFailed",
    "SaveOptions",
    "SaveResult",
    "Saver",
    "ShardedTensor",
    "SingleProcess",
    "TOKENIZER_DIR",
    "ThreadedWorld",
    "__version__",
    "bf16_from_float32",
    "check_config_shapes",
    "committed_checkpoint",
    "exchange_bytes",
    "find_tokenizer",
    "hf_to_mf",
    "hf_tokenizer_files",
    "load",
    "load_hf_state",
    "load_lora_adapter",
    "load_lora_merged_state",
    "make_lora_adapter_meta",
    "merge_lora",
    "merge_lora_checkpoint",
    "mf_to_hf",
    "read_adapter_meta",
    "replicated",
    "run_threaded",
    "save",
    "save_hf",
    "shard_array",
    "split_evenly",
    "split_padded",
    "split_sizes",
    "stored_tensors",
    "supported_model_types",
    "to_float32",
    "tokenizer_assets",
]
