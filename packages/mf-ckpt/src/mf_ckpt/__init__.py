"""Sharded safetensors checkpoints: save, reshard-on-load, inspect, merge and Hugging Face conversion.

Depends on numpy and safetensors only (tqdm for progress bars); never on MindSpore.
"""

from .dtypes import BF16, bf16_from_float32, to_float32
from .errors import CheckpointError
from .hf import hf_to_mf, load_hf_state, mf_to_hf, save_hf, supported_model_types

__version__ = "0.1.0"

__all__ = [
    "BF16",
    "CheckpointError",
    "__version__",
    "bf16_from_float32",
    "hf_to_mf",
    "load_hf_state",
    "mf_to_hf",
    "save_hf",
    "supported_model_types",
    "to_float32",
]
