"""`BlendedMegatronDatasetBuilder`: from a config to (train, valid, test) datasets.

Same case analysis as Megatron-Core for every split:

* one prefix, no weights -> a `GPTDataset` of at least `sizes[split]` samples;
* prefixes with weights -> one `GPTDataset` per prefix, each asked for
  `ceil(ceil(size * weight) * (1 + mid_level_dataset_surplus))` samples, blended to
  `sum(ceil(size * weight))` samples (slightly more than `size`, as in Megatron);
* prefixes without weights -> per-prefix datasets of one epoch each, blended in proportion to
  their lengths, to `min(size, total)` samples or exhaustively when `size` is None;
* `blend_per_split` does the above per split with that split's own prefixes.

Ranks coordinate through the index cache (`mf_data.cache`) instead of collective barriers, so
this works in any process layout: every rank calls `build()`, the rank(s) where
`is_built_on_rank()` is True write the caches, the others wait for them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .blended_dataset import BlendedDataset
from .config import BlendedMegatronDatasetConfig
from .errors import DatasetConfigError
from .gpt_dataset import GPTDataset
from .utils import Split, normalize


def _size_per_split_per_dataset(
    normalized_weights: Sequence[float], target_size_per_split: Sequence[int | None], surplus: float = 0.0
) -> list[list[int]]:
    """Samples to ask of each dataset per split (`None` sizes, for splits not built, count as 0)."""
    if not np.isclose(sum(normalized_weights), 1.0):
        raise DatasetConfigError(f"blend weights must be normalised, got {list(normalized_weights)}")
    return [
        [int(math.ceil(math.ceil((target or 0) * weight) * (1 + surplus))) for target in target_size_per_split]
        for weight in normalized_weights
    ]


class BlendedMegatronDatasetBuilder:
    """`BlendedMegatronDatasetBuilder(cls, sizes, is_built_on_rank, config).build()`."""

    def __init__(
        self,
        cls: type[GPTDataset],
        sizes: Sequence[int | None],
        is_built_on_rank: Callable[[], bool] | None,
        config: BlendedMegatronDatasetConfig,
    ) -> None:
        if len(sizes) != len(Split):
            raise DatasetConfigError(f"sizes needs {len(Split)} entries (train, valid, test), got {list(sizes)!r}")
        for split, size in zip(Split, sizes):
            if size is not None and (isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0):
                raise DatasetConfigError(f"sizes[{split.value}] ({split.name}) must be None or an integer >= 0, got {size!r}")
        self.cls = cls
        self.sizes = [None if s is None else int(s) for s in sizes]
        self.is_built_on_rank = is_built_on_rank or (lambda: True)
        self.config = config
        for split in Split:
            if self.config.blend_per_split is None:
                weights = self.config.blend[1] if self.config.blend else None
                built = self.config.split_matrix[split.value] is not None
            else:
                blend = self.config.blend_per_split[split.value]
                weights = None if blend is None else blend[1]
                built = blend is not None
            if built and weights is not None and self.sizes[split.value] is None:
                raise DatasetConfigError(
                    f"the {split.name} split has blend weights but no size: weighted blends need "
                    f"sizes[{split.value}] (the number of samples to draw)"
                )

    def build(self) -> list[Any | None]:
        """[train, valid, test]; None for a split the config leaves out."""
        if self.config.blend_per_split is None:
            return self._build_from_blend()
        return self._build_per_split()

    # --- one distribution split three ways --------------------------------------------------
    def _build_from_blend(self) -> list[Any | None]:
        prefixes, weights = self.config.blend
        split_matrix = self.config.split_matrix
        if weights is not None:
            weights = normalize(weights)
        if len(prefixes) == 1 and weights is None:
            return self._build_dataset_splits(prefixes[0], split_matrix, self.sizes)
        return self._blend(prefixes, weights, split_matrix, self.sizes, list(range(len(Split))))

    def _build_per_split(self) -> list[Any | None]:
        out: list[Any | None] = [None] * len(Split)
        for i in range(len(Split)):
            blend = self.config.blend_per_split[i]
            if blend is None:
                continue
            prefixes, weights = blend
            split_spoof: list[tuple[float, float] | None] = [None] * len(Split)
            split_spoof[i] = (0.0, 1.0)
            sizes_spoof: list[int | None] = [0] * len(Split)
            sizes_spoof[i] = self.sizes[i]
            if weights is not None:
                weights = normalize(weights)
            if len(prefixes) == 1:
                out[i] = self._build_dataset_splits(prefixes[0], split_spoof, sizes_spoof)[i]
                continue
            out[i] = self._blend(prefixes, weights, split_spoof, sizes_spoof, [i])[i]
        return out

    def _blend(
        self,
        prefixes: list[str],
        weights: list[float] | None,
        split_matrix: list[tuple[float, float] | None],
        sizes: list[int | None],
        splits: list[int],
    ) -> list[Any | None]:
        if weights is None:
            per_dataset_target = None
            per_dataset_buffer = [[None] * len(Split) for _ in prefixes]
        else:
            per_dataset_target = _size_per_split_per_dataset(weights, sizes)
            per_dataset_buffer = _size_per_split_per_dataset(weights, sizes, self.config.mid_level_dataset_surplus)
        mid_level = self._build_parallel(prefixes, split_matrix, per_dataset_buffer)
        out: list[Any | None] = [None] * len(Split)
        for i in splits:
            if split_matrix[i] is None:
                continue
            if weights is not None:
                weights_i: list[float] | list[int] = weights
                size_i: int | None = sum(row[i] for row in per_dataset_target)  # type: ignore[union-attr]
            else:
                weights_i = [len(d) for d in mid_level[i]]
                size_i = None if sizes[i] is None else min(sizes[i], sum(weights_i))
            out[i] = BlendedDataset(mid_level[i], weights_i, size_i, self.config, is_built_on_rank=self.is_built_on_rank)
        return out

    def _build_parallel(
        self, prefixes: list[str], split_matrix: list[tuple[float, float] | None], sizes_per_dataset: list[list[int | None]]
    ) -> list[list[Any]]:
        """Per split, the mid-level dataset of every prefix (built by a small thread pool)."""
        threads = min(self.config.num_dataset_builder_threads, len(prefixes))

        def one(job: tuple[str, list[int | None]]) -> list[Any | None]:
            return self._build_dataset_splits(job[0], split_matrix, job[1])

        jobs = list(zip(prefixes, sizes_per_dataset))
        if threads <= 1:
            results = [one(job) for job in jobs]
        else:
            with ThreadPoolExecutor(max_workers=threads) as pool:
                results = list(pool.map(one, jobs))
        return [[r[i] for r in results] for i in range(len(Split))]

    def _build_dataset_splits(
        self, dataset_path: str, split_matrix: list[tuple[float, float] | None], sizes: list[int | None]
    ) -> list[Any | None]:
        """The mid-level dataset of each split of one prefix (None where the split is empty)."""
        low_level = self.cls.build_low_level_dataset(dataset_path, self.config)
        num_elements = self.cls.numel_low_level_dataset(low_level)
        out: list[Any | None] = []
        for i, split in enumerate(Split):
            bounds = split_matrix[i]
            if bounds is None:
                out.append(None)
                continue
            # Python's round (half to even) on float products, exactly as Megatron computes them.
            beg = int(round(bounds[0] * float(num_elements)))
            end = int(round(bounds[1] * float(num_elements)))
            indices = np.arange(beg, end, dtype=np.int32)
            out.append(
                self.cls(low_level, dataset_path, indices, sizes[i], split, self.config, is_built_on_rank=self.is_built_on_rank)
            )
        return out
