"""Hugging Face <-> mf conversion: per-architecture rule tables, the plan engine, directory I/O."""

from .convert import ARCHITECTURES, architecture, hf_to_mf, mf_to_hf, plan_for, supported_model_types
from .io import HFDirectory, is_hf_dir, load_hf_state, open_hf_dir, read_config, save_hf

__all__ = [
    "ARCHITECTURES",
    "HFDirectory",
    "architecture",
    "hf_to_mf",
    "is_hf_dir",
    "load_hf_state",
    "mf_to_hf",
    "open_hf_dir",
    "plan_for",
    "read_config",
    "save_hf",
    "supported_model_types",
]
