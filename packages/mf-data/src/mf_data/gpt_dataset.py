"""`GPTDataset`: fixed-length samples cut from a shuffled stream of documents.

The three index arrays are Megatron-Core's, bit for bit:

* document index: the split's document ids repeated for every epoch needed and shuffled by
  `RandomState(random_seed)`; when the last epoch would contribute fewer than 80% of an epoch's
  samples it is shuffled separately (so a partial epoch does not favour some documents);
* sample index: where each sample starts, as (position in the document index, token offset);
* shuffle index: a permutation of the samples (the last epoch's samples again separately).

The same random state serves all shuffles, in the order document index(es) then shuffle
index(es), as in Megatron. Sample i reads `sequence_length + 1` tokens (with
`add_extra_token_to_sequence`) starting at its position, pads with `pad` when the stream runs out,
and becomes the columns described in `mf_data.samples`.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import helpers
from .cache import CACHE_FORMAT_VERSION, Expected, describe, load_or_build
from .config import GPTDatasetConfig
from .errors import DatasetTooSmallError
from .indexed_dataset import IndexedDataset
from .samples import build_columns
from .split_dataset import SplitDataset
from .utils import Split

logger = logging.getLogger("mf_data")

_SEPARATE_FINAL_EPOCH_THRESHOLD = 0.80
_LOOP_BATCH = 32  # up to this many samples per read, a Python loop beats the vectorised bookkeeping


class GPTDataset(SplitDataset):
    """Megatron-Core's `GPTDataset` over one split of an `IndexedDataset`.

    Args mirror Megatron's: `indexed_dataset`, `dataset_path` (for bookkeeping and the cache
    description), `indexed_indices` (the document ids this split exposes), `num_samples` (at
    least this many samples, or None for one epoch), `index_split`, `config`. `is_built_on_rank`
    says whether this process builds and writes the index cache (see `mf_data.cache`).
    """

    INDEX_NAMES = ("document_index", "sample_index", "shuffle_index")

    def __init__(
        self,
        indexed_dataset: IndexedDataset,
        dataset_path: str | None,
        indexed_indices: np.ndarray,
        num_samples: int | None,
        index_split: Split | str,
        config: GPTDatasetConfig,
        *,
        is_built_on_rank: Callable[[], bool] | None = None,
    ) -> None:
        self._init_split(indexed_dataset, dataset_path, indexed_indices, num_samples, index_split, config,
                         is_built_on_rank, np.int32)
        self._pad = int(config.pad)
        self._eod = config.eod
        info = np.iinfo(self.dataset.dtype) if np.issubdtype(self.dataset.dtype, np.integer) else None
        # Data can only hold the pad id when the token dtype can represent it.
        self._pad_in_data = info is None or info.min <= self._pad <= info.max
        self.unique_identifiers = self._identifiers()
        self.unique_description, self.unique_description_hash = describe(self.unique_identifiers)
        self.document_index, self.sample_index, self.shuffle_index = self._build_document_sample_shuffle_indices()
        # Plain-ndarray views for the read path (indexing np.memmap objects costs extra per call).
        self._hot = (np.asarray(self.shuffle_index), np.asarray(self.sample_index), np.asarray(self.document_index))

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_hot"] = None  # views of the index arrays: rebuilt, not pickled twice
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._hot = (np.asarray(self.shuffle_index), np.asarray(self.sample_index), np.asarray(self.document_index))

    # --- Megatron's low-level hooks ----------------------------------------------------------
    @staticmethod
    def numel_low_level_dataset(low_level_dataset: IndexedDataset) -> int:
        """GPT splits by sequence (Megatron's choice; a sequence is a document unless pre-split)."""
        return int(low_level_dataset.sequence_lengths.shape[0])

    @staticmethod
    def build_low_level_dataset(dataset_path: str, config: GPTDatasetConfig) -> IndexedDataset:
        return IndexedDataset(dataset_path, multimodal=False, mmap=config.mmap_bin_files)

    # --- description and cache -----------------------------------------------------------------
    def _identifiers(self) -> OrderedDict:
        cfg = self.config
        ids = self._split_identifiers()
        # Beyond Megatron's key: what else the arrays depend on, so a changed input never hits
        # a stale cache (re-preprocessed data under the same prefix, other documents, ...).
        ids["add_extra_token_to_sequence"] = cfg.add_extra_token_to_sequence
        ids["drop_last_partial_sequence"] = self._drop_last_partial_sequence()
        ids["documents"] = {
            "count": int(self.indices.size),
            "md5": hashlib.md5(self.indices.tobytes(), usedforsecurity=False).hexdigest(),
        }
        ids["source"] = {"sequences": len(self.dataset), "tokens": self.dataset.num_tokens}
        ids["format"] = CACHE_FORMAT_VERSION
        return ids

    def _drop_last_partial_sequence(self) -> bool:
        if self.index_split == Split.valid:
            return self.config.drop_last_partial_validation_sequence
        return True

    # --- index building ---------------------------------------------------------------------
    def _plan(self) -> dict[str, Any]:
        """Epochs and sizes of the indices, before building anything."""
        cfg = self.config
        seq, extra = cfg.sequence_length, int(cfg.add_extra_token_to_sequence)
        tokens = int(self.dataset.sequence_lengths[self.indices].sum(dtype=np.int64)) if self.indices.size else 0
        where = f"{self.dataset_path or getattr(self.dataset, 'path_prefix', '?')} ({self.index_split.name} split)"
        if tokens == 0:
            if self.num_samples:
                raise DatasetTooSmallError(
                    f"{where}: no tokens in its {self.indices.size} documents (split {cfg.split!r}), "
                    f"so {self.num_samples} samples cannot be drawn; change the split or the data"
                )
            return {"tokens": 0, "epochs": 1, "separate": False, "num_samples": 0, "sans_final": 0}
        if self.num_samples is None:
            epochs = 1
        else:
            requested = self.num_samples * seq + extra
            epochs = max(1, -(-requested // tokens))
        if epochs * self.indices.size > np.iinfo(np.int32).max:
            raise DatasetTooSmallError(
                f"{where}: {tokens} tokens per epoch would have to be repeated {epochs} times for "
                f"{self.num_samples} samples of {seq} tokens; the split is far too small for the request"
            )
        separate, sans_final = False, 0
        if epochs > 1:
            sans_final = ((epochs - 1) * tokens - extra) // seq
            from_final = self.num_samples - sans_final
            per_epoch = (tokens - extra) // seq
            if not 0 <= from_final <= per_epoch + 1:  # Megatron asserts this; it holds by construction
                raise AssertionError(f"inconsistent epoch arithmetic for {where}")
            separate = from_final < int(_SEPARATE_FINAL_EPOCH_THRESHOLD * per_epoch)
        num_samples = helpers.sample_count(epochs, tokens, seq, self._drop_last_partial_sequence(), extra)
        return {"tokens": tokens, "epochs": epochs, "separate": separate, "num_samples": max(num_samples, 0), "sans_final": sans_final}

    def _build(self, plan: dict[str, Any]) -> dict[str, np.ndarray]:
        cfg = self.config
        rng = np.random.RandomState(cfg.random_seed)
        document_index = helpers.build_document_index(self.indices, plan["epochs"], rng, plan["separate"])
        sample_index = helpers.build_sample_idx(
            self.dataset.sequence_lengths,
            document_index,
            cfg.sequence_length,
            plan["epochs"],
            plan["tokens"],
            self._drop_last_partial_sequence(),
            cfg.add_extra_token_to_sequence,
        )
        total = sample_index.shape[0] - 1
        first = plan["sans_final"] if plan["separate"] else total
        shuffle_index = helpers.build_shuffle_index(first, total, rng)
        return {"document_index": document_index, "sample_index": sample_index, "shuffle_index": shuffle_index}

    def _build_document_sample_shuffle_indices(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        plan = self._plan()
        if plan["tokens"] == 0:
            logger.warning("%s split of %s has no tokens: it is empty", self.index_split.name, self.dataset_path)
            return np.zeros(0, np.int32), np.zeros((1, 2), np.int32), np.zeros(0, np.uint32)
        n = plan["num_samples"]
        sizes = self.dataset.sequence_lengths
        doc_len = plan["epochs"] * int(self.indices.size)
        expected = {
            "document_index": Expected((np.int32,), (doc_len,)),
            "sample_index": Expected((helpers.sample_index_dtype(doc_len, sizes),), (n + 1, 2)),
            "shuffle_index": Expected((np.uint32, np.int64), (n,)),
        }
        arrays = load_or_build(
            self._cache(), expected, lambda: self._build(plan), self.is_built_on_rank,
            self.config.cache_wait_timeout, f"{type(self).__name__} {self.index_split.name}",
        )
        if n == 0:
            logger.warning(
                "%s split of %s: %d tokens per epoch do not fill one sample of %d tokens: it is empty",
                self.index_split.name, self.dataset_path, plan["tokens"], self.config.sequence_length,
            )
        return arrays["document_index"], arrays["sample_index"], arrays["shuffle_index"]

    # --- samples ------------------------------------------------------------------------------
    def get_batch(self, idxs: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
        """Samples `idxs` stacked: each column gets a leading batch dimension."""
        text, short = self.read_text(idxs)
        cfg = self.config
        return build_columns(
            text,
            add_extra_token=cfg.add_extra_token_to_sequence,
            eod=self._eod,
            pad=self._pad,
            check_pad=short or self._pad_in_data,
            reset_position_ids=cfg.reset_position_ids,
            reset_attention_mask=cfg.reset_attention_mask,
            eod_mask_loss=cfg.eod_mask_loss,
            create_attention_mask=cfg.create_attention_mask,
            create_compressed_eod_mask=cfg.create_compressed_eod_mask,
            eod_pad_length=cfg.eod_pad_length,
        )

    def read_text(self, idxs: Sequence[int] | np.ndarray) -> tuple[np.ndarray, bool]:
        """[B, window] token windows of samples `idxs` (the file's integer dtype, or int64 when a
        window needed padding), and whether any did."""
        idxs = np.asarray(idxs, dtype=np.int64).reshape(-1)
        n = len(self)
        if idxs.size and (idxs.min() < -n or idxs.max() >= n):
            raise IndexError(f"sample index out of range for a dataset of {n} samples")
        idxs = np.where(idxs < 0, idxs + n, idxs)
        if 0 < idxs.size <= _LOOP_BATCH and self.dataset.token_array() is not None:
            return self._read_text_loop(idxs)
        return self._read_text_vectorised(idxs)

    def _read_text_loop(self, idxs: np.ndarray) -> tuple[np.ndarray, bool]:
        """Small batches: one sample at a time with Python ints (cheaper than ~40 numpy calls)."""
        extra = int(self.config.add_extra_token_to_sequence)
        window = self.config.sequence_length + extra
        shuffle, sample_index, document_index = self._hot
        lengths = self.dataset.sequence_lengths
        pointers = self.dataset.sequence_pointers
        tokens = self.dataset.token_array()
        itemsize = np.dtype(self.dataset.dtype).itemsize
        out = np.empty((idxs.size, window), dtype=self.dataset.dtype)
        filled = []
        for b, i in enumerate(idxs.tolist()):
            r = int(shuffle[i])
            (b_doc, b_off), (e_doc, e_off) = sample_index[r : r + 2].tolist()
            row = out[b]
            pos = 0
            last = e_doc - b_doc
            for j, doc in enumerate(document_index[b_doc : e_doc + 1].tolist()):
                start = b_off if j == 0 else 0
                stop = e_off + extra if j == last else int(lengths[doc])
                src = int(pointers[doc]) // itemsize + start
                row[pos : pos + stop - start] = tokens[src : src + stop - start]
                pos += stop - start
            filled.append(pos)
        if min(filled) < window:
            out = out.astype(np.int64)
            out[np.arange(window)[None, :] >= np.asarray(filled)[:, None]] = self._pad
            return out, True
        return out, False

    def _read_text_vectorised(self, idxs: np.ndarray) -> tuple[np.ndarray, bool]:
        """Large batches: the per-piece bookkeeping as array operations, then one copy per piece."""
        shuffle, sample_index, document_index = self._hot
        extra = int(self.config.add_extra_token_to_sequence)
        window = self.config.sequence_length + extra
        if idxs.size == 0:
            return np.zeros((0, window), dtype=self.dataset.dtype), False
        rows = shuffle[idxs].astype(np.int64)
        beg = np.asarray(sample_index[rows], dtype=np.int64)
        end = np.asarray(sample_index[rows + 1], dtype=np.int64)
        # One piece per document a sample touches: positions beg_doc..end_doc of the document index.
        counts = end[:, 0] - beg[:, 0] + 1
        total = int(counts.sum())
        sample_of = np.repeat(np.arange(idxs.size), counts)
        first = np.zeros(total, dtype=bool)
        first_at = np.zeros(idxs.size, dtype=np.int64)
        np.cumsum(counts[:-1], out=first_at[1:])
        first[first_at] = True
        last = np.zeros(total, dtype=bool)
        last[first_at + counts - 1] = True
        position = np.arange(total, dtype=np.int64) - first_at[sample_of] + beg[sample_of, 0]
        docs = np.asarray(document_index[position], dtype=np.int64)
        seq_len = self.dataset.sequence_lengths[docs].astype(np.int64)
        start = np.where(first, beg[sample_of, 1], 0)
        stop = np.where(last, end[sample_of, 1] + extra, seq_len)
        length = stop - start
        # Where each piece lands in its sample's window.
        dest = np.cumsum(length) - length
        dest -= dest[first_at][sample_of]
        piece_end = np.cumsum(length)
        filled = piece_end[first_at + counts - 1] - (piece_end - length)[first_at]
        short = bool((filled < window).any())
        # Copy in the file's own dtype (a plain memcpy per piece); int64 only when padding with
        # an id the token dtype may not hold. Columns are widened to int64 later, in one pass.
        token_dtype = self.dataset.dtype
        wide = short or not np.issubdtype(token_dtype, np.integer)
        out = np.empty((idxs.size, window), dtype=np.int64 if wide else token_dtype)
        flat = out.reshape(-1)
        base = (np.arange(idxs.size, dtype=np.int64) * window)[sample_of] + dest
        itemsize = np.dtype(token_dtype).itemsize
        src = self.dataset.sequence_pointers[docs] // itemsize + start
        tokens = self.dataset.token_array()
        if tokens is not None:
            for s, d, k in zip(src.tolist(), base.tolist(), length.tolist()):
                flat[d : d + k] = tokens[s : s + k]
        else:
            for doc, s0, d, k in zip(docs.tolist(), start.tolist(), base.tolist(), length.tolist()):
                flat[d : d + k] = self.dataset.get(doc, s0, k)
        if short:
            cols = np.arange(window)[None, :]
            out[cols >= filled[:, None]] = self._pad
        return out, short
