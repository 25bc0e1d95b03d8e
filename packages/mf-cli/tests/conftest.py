"""Fixtures shared by the mf-cli tests."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> str:
    """A tiny Megatron corpus (40 documents of arithmetic token sequences, vocab < 64) written by mf-data."""
    import mf_data

    prefix = str(tmp_path_factory.mktemp("data") / "toy_text_document")
    rng = np.random.RandomState(0)
    builder = mf_data.IndexedDatasetBuilder(mf_data.get_bin_path(prefix), dtype=np.uint16)
    for _ in range(40):
        start, length = rng.randint(0, 60), rng.randint(40, 100)
        builder.add_item(np.append((start + np.arange(length) * 3) % 61 + 2, 1).astype(np.uint16))
        builder.end_document()
    builder.finalize(mf_data.get_idx_path(prefix))
    return prefix
