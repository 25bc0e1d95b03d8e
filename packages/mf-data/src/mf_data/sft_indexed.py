"""SFT data on disk: a Megatron token dataset plus a loss-mask channel beside it.

    <prefix>.{bin,idx}             token ids (any Megatron dtype), one sequence per sample
    <prefix>_loss_mask.{bin,idx}   the mask channel: a Megatron indexed dataset of dtype uint8,
                                   one byte per token, 1 where the token is part of a response
                                   (trained on), 0 elsewhere; any nonzero byte counts as 1

Both are ordinary `.bin/.idx` pairs (`mf-data inspect` reads either). The channel mirrors the
tokens: the same number of sequences with the same lengths, and the same document index.
`SFTIndexedDataset` checks all of this when it opens the pair, so a mask written for other
data (or a missing one) fails at once with one line naming both files, never with silently
misaligned masks. The token file alone is still a valid pretraining dataset.
"""

from __future__ import annotations

import os

import numpy as np

from .errors import DataFileError, DataFileNotFoundError
from .indexed_dataset import IndexedDataset, get_bin_path, get_idx_path

LOSS_MASK_SUFFIX = "_loss_mask"


def loss_mask_prefix(path_prefix: str) -> str:
    """Where the loss-mask channel of the SFT dataset `path_prefix` lives."""
    return os.fspath(path_prefix) + LOSS_MASK_SUFFIX


class SFTIndexedDataset:
    """The token dataset and its loss-mask channel, opened and cross-checked together.

    `tokens` and `mask` are the two `IndexedDataset`s; `read(i, length)` gives the first
    `length` tokens of sequence i and their mask. The index arrays (`sequence_lengths`,
    `document_indices`, ...) are the token dataset's.
    """

    def __init__(self, path_prefix: str, mmap: bool = True) -> None:
        self._initialize(os.fspath(path_prefix), mmap)

    def _initialize(self, path_prefix: str, mmap: bool) -> None:
        self.path_prefix = path_prefix
        self.mmap = mmap
        self.tokens = IndexedDataset(path_prefix, mmap=mmap)
        mask_prefix = loss_mask_prefix(path_prefix)
        missing = [p for p in (get_idx_path(mask_prefix), get_bin_path(mask_prefix)) if not os.path.isfile(p)]
        if missing:
            raise DataFileNotFoundError(
                f"{missing[0]}: not found: the loss-mask channel of SFT dataset {path_prefix!r} is missing "
                "(write SFT data with `mf-data preprocess-sft`, or use GPTDataset for pretraining data)"
            )
        self.mask = IndexedDataset(mask_prefix, mmap=mmap)
        self._check(mask_prefix)

    def _check(self, mask_prefix: str) -> None:
        tok, mask = self.tokens, self.mask
        where = f"{get_idx_path(mask_prefix)} (loss mask of {get_idx_path(self.path_prefix)})"
        if np.dtype(mask.dtype) != np.uint8:
            raise DataFileError(f"{where}: dtype {np.dtype(mask.dtype).name}, expected uint8")
        if len(mask) != len(tok):
            raise DataFileError(f"{where}: {len(mask)} sequences, the tokens have {len(tok)}")
        if mask.document_indices.shape != tok.document_indices.shape or not np.array_equal(
            mask.document_indices, tok.document_indices
        ):
            raise DataFileError(
                f"{where}: {mask.num_documents} documents with other boundaries than the tokens' {tok.num_documents}"
            )
        if not np.array_equal(mask.sequence_lengths, tok.sequence_lengths):
            i = int(np.argmax(mask.sequence_lengths != tok.sequence_lengths))
            raise DataFileError(
                f"{where}: sequence {i} has {int(mask.sequence_lengths[i])} mask entries for "
                f"{int(tok.sequence_lengths[i])} tokens"
            )

    def __getstate__(self) -> tuple[str, bool]:
        return (self.path_prefix, self.mmap)

    def __setstate__(self, state: tuple[str, bool]) -> None:
        self._initialize(*state)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def dtype(self) -> type[np.number]:
        return self.tokens.dtype

    @property
    def sequence_lengths(self) -> np.ndarray:
        return self.tokens.sequence_lengths

    @property
    def sequence_pointers(self) -> np.ndarray:
        return self.tokens.sequence_pointers

    @property
    def document_indices(self) -> np.ndarray:
        return self.tokens.document_indices

    @property
    def num_tokens(self) -> int:
        return self.tokens.num_tokens

    @property
    def num_documents(self) -> int:
        return self.tokens.num_documents

    def read(self, idx: int, length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The first `length` tokens (all when None) of sequence `idx`, and their mask bytes."""
        return self.tokens.get(idx, 0, length), self.mask.get(idx, 0, length)
