"""What GPTDataset and SFTDataset share: one split of a low-level dataset (its documents, sample
count, config and the rank that builds the index cache), the cache of its index arrays, and
sample access as dicts of arrays (Megatron's `__getitem__`, and the batch-padding sample)."""

from __future__ import annotations

import logging
import os
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from .cache import IndexCache, directory_writable
from .utils import Split, as_split

logger = logging.getLogger("mf_data")


def always() -> bool:
    """The default `is_built_on_rank`: this process builds (one process, or every rank alone)."""
    return True


class SplitDataset(ABC):
    """A subclass sets `INDEX_NAMES` (the cached arrays), calls `_init_split` first in `__init__`,
    builds `unique_description` / `unique_description_hash` and `sample_index`, and implements
    `get_batch(idxs) -> {column: [B, ...] array}`."""

    INDEX_NAMES: tuple[str, ...] = ()

    def _init_split(self, indexed_dataset, dataset_path: str | None, indexed_indices: np.ndarray,
                    num_samples: int | None, index_split: Split | str, config, is_built_on_rank: Callable[[], bool] | None,
                    indices_dtype: type) -> None:
        self.dataset = indexed_dataset
        self.dataset_path = dataset_path
        self.indices = np.asarray(indexed_indices, dtype=indices_dtype)
        if num_samples is not None and (isinstance(num_samples, bool) or int(num_samples) != num_samples or num_samples < 0):
            raise ValueError(f"num_samples must be None or an integer >= 0, got {num_samples!r}")
        self.num_samples = None if num_samples is None else int(num_samples)
        self.index_split = as_split(index_split)
        self.config = config
        self.is_built_on_rank = is_built_on_rank or always
        self._padding_sample: dict[str, np.ndarray] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["is_built_on_rank"] = None  # may be a lambda; only needed while building
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.is_built_on_rank = always

    # --- description and cache -----------------------------------------------------------------
    def _split_identifiers(self) -> OrderedDict:
        """The first keys of the cache description (Megatron's), in its order."""
        cfg = self.config
        ids: OrderedDict[str, Any] = OrderedDict()
        ids["class"] = type(self).__name__
        ids["dataset_path"] = self.dataset_path
        ids["num_samples"] = self.num_samples
        ids["index_split"] = self.index_split.name
        ids["random_seed"] = cfg.random_seed
        ids["sequence_length"] = cfg.sequence_length
        ids["split"] = cfg.split
        ids["split_matrix"] = cfg.split_matrix
        return ids

    def _cache(self) -> IndexCache | None:
        path = self.config.path_to_cache
        if path is None:
            prefix = getattr(self.dataset, "path_prefix", None)
            if prefix is None:
                return None
            path = os.path.join(prefix, "cache", f"{type(self).__name__}_indices")
            if not directory_writable(path):
                logger.warning(
                    "cannot create the index cache beside the data (%s): building the %s indices in memory; "
                    "set path_to_cache to share them between runs and ranks", path, self.index_split.name,
                )
                return None
        base = f"{self.unique_description_hash}-{type(self).__name__}-{self.index_split.name}"
        return IndexCache(path, base, self.unique_description, self.INDEX_NAMES)

    # --- samples ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.sample_index.shape[0] - 1)

    def __getitem__(self, idx: int | None) -> dict[str, np.ndarray]:
        """One sample as a dict of arrays; `None` gives Megatron's batch-padding sample."""
        if idx is None:
            return self.padding_sample()
        batch = self.get_batch([idx])
        return {k: v[0] for k, v in batch.items()}

    def padding_sample(self) -> dict[str, np.ndarray]:
        """Sample 0 with a zero loss mask: fills a short last batch without adding to the loss."""
        if self._padding_sample is None:
            sample = self[0]
            sample["loss_mask"] = np.zeros_like(sample["loss_mask"])
            self._padding_sample = sample
        return {k: v.copy() for k, v in self._padding_sample.items()}

    @abstractmethod
    def get_batch(self, idxs) -> dict[str, np.ndarray]:
        """The samples at `idxs`, stacked per key (GPTDataset, SFTDataset)."""
