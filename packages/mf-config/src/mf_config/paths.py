"""`path_warnings`: inputs named by the config that are not on this machine.

Only warnings: the config may be validated on a laptop and run on a cluster where the paths
exist. Nothing here touches the files beyond asking whether they exist.
"""

from __future__ import annotations

import os

from mf_config.config import TrainConfig
from mf_config.data_rules import dataloader_prefixes


def path_warnings(cfg: TrainConfig) -> list[str]:
    """One line per missing input: dataset .bin/.idx files, checkpoint.load_path, tokenizer.path,
    inference.input_file. The config must already be valid (from `load_config`)."""
    warnings: list[str] = []
    datasets = [("train_dataset", cfg.train_dataset)]
    if cfg.eval_dataset is not None:
        datasets.append(("eval_dataset", cfg.eval_dataset))
    for name, dataset in datasets:
        for prefix in dataloader_prefixes(dataset.dataloader):
            missing = [ext for ext in (".bin", ".idx") if not os.path.isfile(prefix + ext)]
            if missing:
                files = " and ".join(prefix + ext for ext in missing)
                warnings.append(f"{name}.dataloader.config.data_path: {files} not found")
    if cfg.checkpoint.load_path and not os.path.exists(cfg.checkpoint.load_path):
        warnings.append(f"checkpoint.load_path: {cfg.checkpoint.load_path} not found")
    if cfg.tokenizer.path and not os.path.exists(cfg.tokenizer.path):
        warnings.append(f"tokenizer.path: {cfg.tokenizer.path} not found")
    if cfg.inference.input_file and not os.path.isfile(cfg.inference.input_file):
        warnings.append(f"inference.input_file: {cfg.inference.input_file} not found")
    return warnings
