"""Every array and stored sample of every case in shared/fixtures/megatron/cases.json, written by
Megatron-Core 0.16.1 itself, must come out identical. The test is driven by cases.json and the
npz keys alone: a key it does not know how to check fails the test instead of being skipped."""

from __future__ import annotations

import re

import numpy as np
import pytest

from mf_data import BlendedDataset, GPTDataset

_INDEX_ARRAYS = ("document_index", "sample_index", "shuffle_index")
_SAMPLE_COLUMNS = {"tokens": "input_ids", "labels": "labels", "loss_mask": "loss_mask", "position_ids": "position_ids"}
_KEY = re.compile(
    r"^(?P<split>train|valid|test)_(?:"
    r"(?P<len>len)"
    r"|(?P<top>document_index|sample_index|shuffle_index|dataset_index|dataset_sample_index)"
    r"|ds(?P<ds>\d+)_(?P<inner>document_index|sample_index|shuffle_index)"
    r"|sample(?P<sample>\d+)_(?P<column>tokens|labels|loss_mask|position_ids))$"
)


def _split_dataset(datasets, split):
    return datasets[("train", "valid", "test").index(split)]


def _mismatches(name, reference, datasets) -> list[str]:
    problems = []
    checked_samples = {}
    for key in reference.files:
        m = _KEY.match(key)
        if m is None:
            problems.append(f"{name}: key {key!r} has no check")
            continue
        ds = _split_dataset(datasets, m["split"])
        expected = reference[key]
        if m["len"]:
            actual = 0 if ds is None else len(ds)
            if int(expected) != actual:
                problems.append(f"{name}: {key} is {actual}, expected {int(expected)}")
            continue
        if ds is None:
            problems.append(f"{name}: {key} present but the {m['split']} split was not built")
            continue
        if m["top"]:
            actual = getattr(ds, m["top"])
        elif m["ds"] is not None:
            if not isinstance(ds, BlendedDataset):
                problems.append(f"{name}: {key} expects a blend")
                continue
            actual = getattr(ds.datasets[int(m["ds"])], m["inner"])
        else:
            i = int(m["sample"])
            if (m["split"], i) not in checked_samples:
                checked_samples[m["split"], i] = ds[i]
            actual = checked_samples[m["split"], i][_SAMPLE_COLUMNS[m["column"]]]
        actual = np.asarray(actual)
        if actual.shape != expected.shape or not np.array_equal(actual, expected):
            problems.append(f"{name}: {key} differs (shape {actual.shape} vs {expected.shape})")
    return problems


def test_every_case_matches_megatron(megatron_fixtures, megatron_cases, built_cases):
    assert megatron_cases, "cases.json lists no case"
    problems = []
    for name in megatron_cases:
        with np.load(megatron_fixtures / f"{name}.npz") as reference:
            problems += _mismatches(name, reference, built_cases[name])
    assert not problems, "\n".join(problems)


def test_splits_not_in_the_reference_are_not_built(megatron_fixtures, megatron_cases, built_cases):
    for name in megatron_cases:
        with np.load(megatron_fixtures / f"{name}.npz") as reference:
            for split, ds in zip(("train", "valid", "test"), built_cases[name]):
                if f"{split}_len" not in reference.files:
                    assert ds is None, f"{name}: {split} should not exist"


def _megatron_sample_text(ds: GPTDataset, idx: int) -> np.ndarray:
    """Megatron's `_query_document_sample_shuffle_indices`, one document part at a time."""
    x = int(ds.config.add_extra_token_to_sequence)
    i = int(ds.shuffle_index[idx])
    b_doc, b_off = (int(v) for v in ds.sample_index[i])
    e_doc, e_off = (int(v) for v in ds.sample_index[i + 1])
    parts = []
    if b_doc == e_doc:
        parts.append(ds.dataset.get(int(ds.document_index[b_doc]), b_off, e_off - b_off + x))
    else:
        for j in range(b_doc, e_doc + 1):
            offset = b_off if j == b_doc else 0
            length = None if j < e_doc else e_off + x
            parts.append(ds.dataset.get(int(ds.document_index[j]), offset, length))
    text = np.concatenate(parts).astype(np.int64)
    window = ds.config.sequence_length + x
    return np.concatenate([text, np.full(window - text.size, ds.config.pad, np.int64)])


@pytest.mark.parametrize("split_pos", [0, 1, 2])
def test_batched_reads_match_megatron_part_by_part_reads(built_cases, split_pos):
    """Beyond the stored samples: every sample of every case, via the batched reader."""
    for name, datasets in built_cases.items():
        ds = datasets[split_pos]
        if ds is None:
            continue
        inner = ds.datasets if isinstance(ds, BlendedDataset) else [ds]
        for gpt in inner:
            if len(gpt) == 0:
                continue
            text, _ = gpt.read_text(np.arange(len(gpt)))
            expected = np.stack([_megatron_sample_text(gpt, i) for i in range(len(gpt))])
            assert np.array_equal(text, expected), name
        if len(ds):
            order = np.random.default_rng(0).permutation(len(ds))[:64]
            batch = ds.get_batch(order)
            for row, i in enumerate(order):
                single = ds[int(i)]
                for column, value in batch.items():
                    assert np.array_equal(value[row], single[column]), (name, column, i)
