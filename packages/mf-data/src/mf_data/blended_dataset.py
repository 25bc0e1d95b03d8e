"""`BlendedDataset`: samples drawn from several datasets in fixed proportions.

`dataset_index[i]` says which dataset sample i comes from and `dataset_sample_index[i]` which of
its samples; both are built by Megatron's greedy rule (each step serves the dataset furthest
behind its share), or, with `size=None`, exhaustively (`weights` are then integer sample counts
and every dataset is drawn exactly that often). Indices are cached like GPTDataset's when
`config.path_to_cache` is set (Megatron caches blends only there too).
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import helpers
from .cache import CACHE_FORMAT_VERSION, Expected, IndexCache, describe, load_or_build
from .config import BlendedMegatronDatasetConfig
from .errors import DatasetConfigError, DatasetTooSmallError
from .split_dataset import always
from .utils import normalize

logger = logging.getLogger("mf_data")

_INDEX_NAMES = ("dataset_index", "dataset_sample_index")


class BlendedDataset:
    """Megatron-Core's `BlendedDataset(datasets, weights, size, config)`."""

    def __init__(
        self,
        datasets: Sequence[Any],
        weights: Sequence[float | int],
        size: int | None,
        config: BlendedMegatronDatasetConfig,
        *,
        is_built_on_rank: Callable[[], bool] | None = None,
    ) -> None:
        if not datasets or len(datasets) != len(weights):
            raise DatasetConfigError(f"BlendedDataset needs one weight per dataset, got {len(datasets)} datasets and {len(weights)} weights")
        if len(datasets) >= 32767:
            raise DatasetConfigError("a blend holds at most 32766 datasets (the dataset index is int16)")
        splits = {d.index_split for d in datasets}
        if len(splits) != 1:
            raise DatasetConfigError("every dataset of a blend must come from the same split")
        for d, w in zip(datasets, weights):
            if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)) or not math.isfinite(w) or w <= 0:
                name = getattr(d, "dataset_path", None) or type(d).__name__
                if isinstance(w, (int, np.integer)) and w == 0 and len(d) == 0:
                    raise DatasetTooSmallError(
                        f"{name} ({d.index_split.name} split): too small for one sample of "
                        f"{config.sequence_length} tokens, so it cannot be blended"
                    )
                raise DatasetConfigError(f"blend weight of {name} must be finite and > 0, got {w!r}")
        if size is None:
            if any(int(w) != w for w in weights):
                raise DatasetConfigError("an exhaustive blend (size None) needs integer weights: samples per dataset")
            weights = [int(w) for w in weights]
        else:
            if isinstance(size, bool) or int(size) != size or size < 0:
                raise DatasetConfigError(f"blend size must be None or an integer >= 0, got {size!r}")
            size = int(size)
            weights = normalize(weights)
        if len(datasets) == 1:
            logger.info("building a BlendedDataset over a single dataset")
        self.datasets = list(datasets)
        self.split = self.datasets[0].index_split
        self.weights = weights
        self.size = size
        self.config = config
        self.is_built_on_rank = is_built_on_rank or always
        ids: OrderedDict[str, Any] = OrderedDict()
        ids["class"] = type(self).__name__
        ids["datasets"] = [d.unique_identifiers for d in self.datasets]
        ids["split"] = self.split.name
        ids["weights"] = self.weights
        ids["size"] = self.size
        ids["format"] = CACHE_FORMAT_VERSION
        self.unique_identifiers = ids
        self.unique_description, self.unique_description_hash = describe(ids)
        self.dataset_index, self.dataset_sample_index = self._build_indices()

    def __getstate__(self) -> dict[str, Any]:
        # The build callback is only needed while building; it may not pickle (a lambda).
        state = dict(self.__dict__)
        state["is_built_on_rank"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.is_built_on_rank = always

    def _build(self) -> dict[str, np.ndarray]:
        if self.size is not None:
            dataset_index, dataset_sample_index = helpers.build_blending_indices(self.weights, self.size)
        else:
            dataset_index, dataset_sample_index = helpers.build_exhaustive_blending_indices(self.weights)
        ids, counts = np.unique(dataset_index, return_counts=True)
        for k, (i, count) in enumerate(zip(ids.tolist(), counts.tolist())):
            available = len(self.datasets[i])
            if available < count:
                raise DatasetTooSmallError(
                    f"the {self.split.name} blend asks {count} samples of dataset {k} "
                    f"({getattr(self.datasets[i], 'dataset_path', i)}), which has {available}; raise "
                    f"mid_level_dataset_surplus (now {self.config.mid_level_dataset_surplus}), e.g. ten-fold"
                )
        return {"dataset_index": dataset_index, "dataset_sample_index": dataset_sample_index}

    def _build_indices(self) -> tuple[np.ndarray, np.ndarray]:
        total = self.size if self.size is not None else int(sum(self.weights))
        expected = {
            "dataset_index": Expected((np.int16,), (total,)),
            "dataset_sample_index": Expected((np.int64,), (total,)),
        }
        cache = None
        if self.config.path_to_cache:
            base = f"{self.unique_description_hash}-{type(self).__name__}-{self.split.name}"
            cache = IndexCache(self.config.path_to_cache, base, self.unique_description, _INDEX_NAMES)
        arrays = load_or_build(
            cache, expected, self._build, self.is_built_on_rank, self.config.cache_wait_timeout,
            f"{type(self).__name__} {self.split.name}",
        )
        return arrays["dataset_index"], arrays["dataset_sample_index"]

    def __len__(self) -> int:
        return int(self.dataset_index.shape[0])

    def __getitem__(self, idx: int) -> dict[str, Any]:
        dataset_id = int(self.dataset_index[idx])
        sample = self.datasets[dataset_id][int(self.dataset_sample_index[idx])]
        return {"dataset_id": dataset_id, **sample}

    def get_batch(self, idxs: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
        """Samples `idxs` stacked, each fetched in one batch per contributing dataset."""
        idxs = np.asarray(idxs, dtype=np.int64).reshape(-1)
        n = len(self)
        if idxs.size and (idxs.min() < -n or idxs.max() >= n):
            raise IndexError(f"sample index out of range for a blend of {n} samples")
        which = np.asarray(self.dataset_index[idxs], dtype=np.int64)
        inner = np.asarray(self.dataset_sample_index[idxs], dtype=np.int64)
        out: dict[str, np.ndarray] = {}
        for d in np.unique(which).tolist():
            rows = np.flatnonzero(which == d)
            part = self.datasets[d].get_batch(inner[rows])
            for key, value in part.items():
                if key not in out:
                    out[key] = np.empty((idxs.size, *value.shape[1:]), dtype=value.dtype)
                out[key][rows] = value
        return out

    def padding_sample(self) -> dict[str, np.ndarray]:
        d = int(self.dataset_index[0])
        return self.datasets[d].padding_sample()
