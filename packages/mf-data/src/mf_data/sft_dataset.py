"""`SFTDataset`: packed rows of supervised samples, with the columns GPTDataset yields.

Built like `GPTDataset` (through `BlendedMegatronDatasetBuilder`, so split strings, blends and
per-split paths work the same) over an `SFTIndexedDataset` (tokens + loss-mask channel). A
split is a range of sequences (one sequence = one sample). Its two index arrays:

* `document_index`: the split's samples, epoch after epoch, each epoch a fresh permutation
  drawn from `numpy.random.RandomState(random_seed)` (one `permutation` call per epoch, in epoch
  order) - empty samples left out;
* `sample_index`: where each row starts in `document_index` (`mf_data.sft_packing`: sequential
  packing, at most `eod_pad_length - 1` samples per row), then its length.

Epochs are added until there are at least `num_samples` rows (one epoch when None); rows never
span two epochs. Rows are served in that order (the permutations are the shuffle). The arrays
are cached exactly like GPTDataset's (`<md5>-SFTDataset-<split>-*.npy`, built by one rank).
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np

from .cache import CACHE_FORMAT_VERSION, Expected, describe, load_or_build
from .errors import DatasetTooSmallError
from .sft_config import SFTDatasetConfig
from .sft_indexed import SFTIndexedDataset
from .sft_packing import build_sft_columns, pack_rows
from .split_dataset import SplitDataset
from .utils import Split

logger = logging.getLogger("mf_data")

PACKING = "sequential-v1"  # part of the cache description: a new packing rule gets new caches


class SFTDataset(SplitDataset):
    """Packed SFT rows over one split of an `SFTIndexedDataset` (arguments as GPTDataset's); a row is
    a sample (`__getitem__`, `padding_sample`: split_dataset.py)."""

    INDEX_NAMES = ("document_index", "sample_index")

    def __init__(
        self,
        indexed_dataset: SFTIndexedDataset,
        dataset_path: str | None,
        indexed_indices: np.ndarray,
        num_samples: int | None,
        index_split: Split | str,
        config: SFTDatasetConfig,
        *,
        is_built_on_rank: Callable[[], bool] | None = None,
    ) -> None:
        self._init_split(indexed_dataset, dataset_path, indexed_indices, num_samples, index_split, config,
                         is_built_on_rank, np.int64)
        lengths = self.dataset.sequence_lengths[self.indices] if self.indices.size else np.zeros(0, np.int32)
        self.truncated = int((lengths > config.sequence_length).sum())
        self.unique_identifiers = self._identifiers()
        self.unique_description, self.unique_description_hash = describe(self.unique_identifiers)
        self.document_index, self.sample_index = self._build_indices()
        if self.truncated and len(self):
            logger.warning(
                "%s (%s split): %d of %d samples are longer than seq_length %d and are truncated to their first "
                "%d tokens", dataset_path, self.index_split.name, self.truncated, self.indices.size,
                config.sequence_length, config.sequence_length,
            )
        if not (config.create_attention_mask or config.create_compressed_eod_mask):
            logger.warning(
                "SFTDataset without create_attention_mask or create_compressed_eod_mask: the samples packed into "
                "a row can attend to each other unless the model separates them itself",
            )

    # --- the builder's hooks -------------------------------------------------------------
    @staticmethod
    def numel_low_level_dataset(low_level_dataset: SFTIndexedDataset) -> int:
        return len(low_level_dataset)

    @staticmethod
    def build_low_level_dataset(dataset_path: str, config: SFTDatasetConfig) -> SFTIndexedDataset:
        return SFTIndexedDataset(dataset_path, mmap=config.mmap_bin_files)

    # --- indices --------------------------------------------------------------------------
    def _identifiers(self) -> OrderedDict:
        cfg = self.config
        ids = self._split_identifiers()
        ids["max_samples_per_row"] = cfg.max_samples_per_row
        ids["packing"] = PACKING
        ids["documents"] = {
            "count": int(self.indices.size),
            "md5": hashlib.md5(self.indices.astype(np.int64).tobytes(), usedforsecurity=False).hexdigest(),
        }
        lengths = np.ascontiguousarray(self.dataset.sequence_lengths)
        ids["source"] = {
            "sequences": len(self.dataset),
            "tokens": self.dataset.num_tokens,
            "lengths_md5": hashlib.md5(lengths.tobytes(), usedforsecurity=False).hexdigest(),
        }
        ids["format"] = CACHE_FORMAT_VERSION
        return ids

    def _build(self) -> dict[str, np.ndarray]:
        cfg = self.config
        seq = cfg.sequence_length
        lengths = np.minimum(self.dataset.sequence_lengths[self.indices].astype(np.int64), seq)
        samples = self.indices[lengths > 0]
        clipped = np.minimum(self.dataset.sequence_lengths.astype(np.int64), seq)
        rng = np.random.RandomState(cfg.random_seed)
        orders, starts = [], []
        rows = offset = 0
        target = self.num_samples or 0
        while not orders or rows < target:
            order = samples[rng.permutation(samples.size)]
            bounds = pack_rows(clipped[order], seq, cfg.max_samples_per_row)
            orders.append(order)
            starts.append(bounds[:-1] + offset)
            offset += order.size
            rows += bounds.size - 1
        starts.append(np.asarray([offset], dtype=np.int64))
        index_dtype = np.int32 if len(self.dataset) <= np.iinfo(np.int32).max else np.int64
        return {"document_index": np.concatenate(orders).astype(index_dtype), "sample_index": np.concatenate(starts)}

    def _validate(self, arrays: dict[str, np.ndarray]) -> str:
        docs, starts = arrays["document_index"], arrays["sample_index"]
        if starts.size == 0 or starts[0] != 0 or starts[-1] != docs.size or np.any(np.diff(starts) <= 0):
            return "sample_index does not partition document_index"
        if docs.size and (docs.min() < 0 or docs.max() >= len(self.dataset)):
            return "document_index points outside the dataset"
        if self.num_samples and starts.size - 1 < self.num_samples:
            return f"{starts.size - 1} rows, fewer than the {self.num_samples} requested"
        return ""

    def _build_indices(self) -> tuple[np.ndarray, np.ndarray]:
        tokens = int(self.dataset.sequence_lengths[self.indices].sum(dtype=np.int64)) if self.indices.size else 0
        where = f"{self.dataset_path or self.dataset.path_prefix} ({self.index_split.name} split)"
        if tokens == 0:
            if self.num_samples:
                raise DatasetTooSmallError(
                    f"{where}: no tokens in its {self.indices.size} samples (split {self.config.split!r}), so "
                    f"{self.num_samples} rows cannot be drawn; change the split or the data"
                )
            logger.warning("%s has no tokens: it is empty", where)
            return np.zeros(0, np.int32), np.zeros(1, np.int64)
        expected = {
            "document_index": Expected((np.int32, np.int64), (None,)),
            "sample_index": Expected((np.int64,), (None,)),
        }
        arrays = load_or_build(
            self._cache(), expected, self._build, self.is_built_on_rank, self.config.cache_wait_timeout,
            f"{type(self).__name__} {self.index_split.name}", validate=self._validate,
        )
        return arrays["document_index"], arrays["sample_index"]

    # --- rows -----------------------------------------------------------------------------
    def row_samples(self, idx: int) -> np.ndarray:
        """The sequence ids packed into row `idx`, in order."""
        return np.asarray(self.document_index[int(self.sample_index[idx]) : int(self.sample_index[idx + 1])])

    def get_batch(self, idxs: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
        """Rows `idxs` stacked: each column gets a leading batch dimension."""
        idxs = np.asarray(idxs, dtype=np.int64).reshape(-1)
        n = len(self)
        if idxs.size and (idxs.min() < -n or idxs.max() >= n):
            raise IndexError(f"sample index out of range for a dataset of {n} samples")
        idxs = np.where(idxs < 0, idxs + n, idxs)
        seq = self.config.sequence_length
        tokens = np.zeros((idxs.size, seq), dtype=np.int64)
        mask = np.zeros((idxs.size, seq), dtype=bool)
        lengths = self.dataset.sequence_lengths
        ends: list[list[int]] = []
        for b, r in enumerate(idxs.tolist()):
            pos = 0
            row_ends = []
            for s in self.row_samples(r).tolist():
                k = min(int(lengths[s]), seq)
                ids, bits = self.dataset.read(s, k)
                tokens[b, pos : pos + k] = ids
                mask[b, pos : pos + k] = bits != 0
                pos += k
                row_ends.append(pos)
            if pos < seq:
                row_ends.append(seq)  # the padding: a segment of its own
            ends.append(row_ends)
        cfg = self.config
        return build_sft_columns(
            tokens, mask, ends, create_attention_mask=cfg.create_attention_mask,
            create_compressed_eod_mask=cfg.create_compressed_eod_mask, eod_pad_length=cfg.eod_pad_length,
        )
