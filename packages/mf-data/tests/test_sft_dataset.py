"""SFTDataset: packing invariants, determinism and epochs, the mask channel's consistency checks,
and the loader serving it from the YAML block."""

from __future__ import annotations

import numpy as np
import pytest

from mf_data import (
    BlendedMegatronDatasetBuilder,
    BlendedMegatronDatasetDataLoader,
    DataFileError,
    DataFileNotFoundError,
    DatasetConfigError,
    IndexedDatasetBuilder,
    SFTDataset,
    SFTDatasetConfig,
    SFTIndexedDataset,
    build_from_yaml_block,
    loss_mask_prefix,
)
from mf_data.sft_packing import pack_rows

VOCAB = 1000


def _write_pair(prefix, samples, mask_dtype=np.uint8, mask_lengths=None):
    """Tokens and mask channel; samples are (ids, mask) pairs, one document each."""
    tok = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    msk = IndexedDatasetBuilder(loss_mask_prefix(prefix) + ".bin", dtype=mask_dtype)
    for k, (ids, bits) in enumerate(samples):
        tok.add_document(np.asarray(ids), [len(ids)])
        bits = np.asarray(bits)
        if mask_lengths is not None:
            bits = np.resize(bits, mask_lengths[k])
        msk.add_document(bits, [bits.size])
    tok.finalize(prefix + ".idx")
    msk.finalize(loss_mask_prefix(prefix) + ".idx")
    return prefix


def _samples(n, seed=0, max_len=30):
    """Sample k: ids k*VOCAB' + position-coded tokens (unique per sample, so rows can be decoded
    back to (sample, position)); a prompt of random length, then a response."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        length = int(rng.integers(2, max_len))
        prompt = int(rng.integers(1, length))
        ids = [(k * 64 + t) % 60000 for t in range(length)]
        out.append((ids, [0] * prompt + [1] * (length - prompt)))
    return out


def _config(prefix, tmp_path, **kw):
    fields = dict(random_seed=7, sequence_length=48, blend=([prefix], None), split="1,0,0",
                  path_to_cache=str(tmp_path / "cache"), create_attention_mask=True, create_compressed_eod_mask=True,
                  eod_pad_length=16)
    fields.update(kw)
    return SFTDatasetConfig(**fields)


def _build(prefix, tmp_path, size, **kw):
    return BlendedMegatronDatasetBuilder(SFTDataset, [size, 0, 0], lambda: True, _config(prefix, tmp_path, **kw)).build()[0]


def test_packing_invariants(tmp_path):
    samples = _samples(120) + [([(99 * 64 + t) % 60000 for t in range(70)], [0] * 10 + [1] * 60)]  # one too long
    prefix = _write_pair(str(tmp_path / "d"), samples)
    ds = _build(prefix, tmp_path, None)
    assert ds.truncated == 1
    S = 48
    seen = []
    batch = ds.get_batch(np.arange(len(ds)))
    for r in range(len(ds)):
        ids_in_row = ds.row_samples(r).tolist()
        seen += ids_in_row
        ends, pos = [], 0
        for s in ids_in_row:
            ids, bits = samples[s]
            n = min(len(ids), S)
            sl = slice(pos, pos + n)
            assert batch["input_ids"][r, sl].tolist() == ids[:n]
            assert batch["position_ids"][r, sl].tolist() == list(range(n))          # positions restart
            assert batch["labels"][r, pos : pos + n - 1].tolist() == ids[1:n]        # next token, same sample
            assert batch["labels"][r, pos + n - 1] == 0 and batch["loss_mask"][r, pos + n - 1] == 0  # predicts nothing
            assert batch["loss_mask"][r, pos : pos + n - 1].tolist() == bits[1:n]   # loss on response tokens
            pos += n
            ends.append(pos)
        assert pos <= S
        if pos < S:  # padding: ids 0, no loss, a segment of its own
            assert not batch["input_ids"][r, pos:].any() and not batch["loss_mask"][r, pos:].any()
            assert batch["position_ids"][r, pos:].tolist() == list(range(S - pos))
            ends.append(S)
        assert batch["actual_seq_len"][r].tolist() == ends + [S] * (16 - len(ends))
        segment = np.repeat(np.arange(len(ends)), np.diff([0] + ends))
        want = (segment[:, None] != segment[None, :]) | np.triu(np.ones((S, S), bool), 1)
        assert np.array_equal(batch["attention_mask"][r, 0], want)
    assert sorted(seen) == list(range(len(samples)))  # one epoch: every sample exactly once
    assert ds[3]["input_ids"].tolist() == batch["input_ids"][3].tolist()
    assert not ds.padding_sample()["loss_mask"].any()


def test_unmapped_reads_give_the_same_rows(tmp_path):
    prefix = _write_pair(str(tmp_path / "d"), _samples(30))
    mapped = _build(prefix, tmp_path, 20)
    unmapped = _build(prefix, tmp_path, 20, mmap_bin_files=False)
    assert unmapped.dataset.tokens.token_array() is None  # pread path
    rows = np.arange(len(mapped))
    a, b = mapped.get_batch(rows), unmapped.get_batch(rows)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_pack_rows_is_sequential_next_fit():
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 41, size=500)
    bounds = pack_rows(lengths, 40, 5)
    # The plain loop the docstring describes.
    want, start, used = [0], 0, 0
    for i, n in enumerate(lengths.tolist()):
        if used + n > 40 or i - start == 5:
            want.append(i)
            start, used = i, 0
        used += n
    want.append(lengths.size)
    assert bounds.tolist() == want


def test_deterministic_epochs_and_cache(tmp_path):
    prefix = _write_pair(str(tmp_path / "d"), _samples(40))
    one_epoch = len(_build(prefix, tmp_path, None))
    ds = _build(prefix, tmp_path, 3 * one_epoch + 1)
    assert len(ds) >= 3 * one_epoch + 1
    counts = np.bincount(np.asarray(ds.document_index), minlength=40)
    epochs = int(counts.max())
    assert counts.min() == epochs >= 3  # whole epochs: every sample equally often
    rows_before_last = int((np.asarray(ds.sample_index[:-1]) < (epochs - 1) * 40).sum())
    assert rows_before_last < 3 * one_epoch + 1  # ... and no more epochs than needed
    assert ds.sample_index[rows_before_last] == (epochs - 1) * 40  # rows never span two epochs
    first = np.asarray(ds.document_index[:40])
    second = np.asarray(ds.document_index[40:80])
    assert sorted(first) == sorted(second) and not np.array_equal(first, second)  # reshuffled per epoch
    # Same seed -> same arrays, loaded from the cache; another seed -> another order.
    cached = sorted(p.name for p in (tmp_path / "cache").iterdir())
    again = _build(prefix, tmp_path, 3 * one_epoch + 1)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == cached
    assert isinstance(again.sample_index, np.memmap)
    assert np.array_equal(again.document_index, ds.document_index) and np.array_equal(again.sample_index, ds.sample_index)
    other = _build(prefix, tmp_path, 3 * one_epoch + 1, random_seed=8)
    assert not np.array_equal(other.document_index[:40], first)


def test_splits_and_max_samples_per_row(tmp_path):
    prefix = _write_pair(str(tmp_path / "d"), [([5, 6, 7], [0, 1, 1])] * 100)
    config = _config(prefix, tmp_path, split="80,20,0", eod_pad_length=4)
    train, valid, test = BlendedMegatronDatasetBuilder(SFTDataset, [None, None, None], lambda: True, config).build()
    assert test is None
    assert set(np.asarray(train.document_index).tolist()) == set(range(80))
    assert set(np.asarray(valid.document_index).tolist()) == set(range(80, 100))
    assert np.diff(train.sample_index).max() == 3  # eod_pad_length - 1 samples per row: boundaries fit
    assert train[0]["actual_seq_len"].tolist() == [3, 6, 9, 48]


def test_mask_channel_consistency_errors(tmp_path):
    samples = _samples(5)
    prefix = _write_pair(str(tmp_path / "ok"), samples)
    assert len(SFTIndexedDataset(prefix)) == 5
    bad_len = [len(ids) for ids, _ in samples]
    bad_len[3] += 1
    prefix = _write_pair(str(tmp_path / "len"), samples, mask_lengths=bad_len)
    with pytest.raises(DataFileError, match="sequence 3 has .* mask entries for"):
        SFTIndexedDataset(prefix)
    prefix = _write_pair(str(tmp_path / "dtype"), samples, mask_dtype=np.int32)
    with pytest.raises(DataFileError, match="dtype int32, expected uint8"):
        SFTIndexedDataset(prefix)
    prefix = _write_pair(str(tmp_path / "count"), samples)
    _write_pair(str(tmp_path / "count4"), samples[:4])
    for ext in (".bin", ".idx"):
        (tmp_path / f"count_loss_mask{ext}").write_bytes((tmp_path / f"count4_loss_mask{ext}").read_bytes())
    with pytest.raises(DataFileError, match="4 sequences, the tokens have 5"):
        SFTIndexedDataset(prefix)
    (tmp_path / "count_loss_mask.idx").unlink()
    with pytest.raises(DataFileNotFoundError, match="count_loss_mask.idx: not found: the loss-mask channel"):
        SFTIndexedDataset(prefix)
    # Through the loader the same error is one DatasetConfigError-free line (an MFDataError).
    with pytest.raises(DataFileNotFoundError):
        BlendedMegatronDatasetDataLoader(datasets_type="SFTDataset", sizes=[4, 0, 0],
                                         config={"seq_length": 16, "split": "1", "data_path": [prefix]})


def _yaml(prefix, tmp_path, **config):
    return {
        "dataloader": {
            "type": "BlendedMegatronDatasetDataLoader",
            "datasets_type": "SFTDataset",
            "sizes": [60, 0, 0],
            "column_names": ["input_ids", "labels", "loss_mask", "position_ids", "attention_mask"],
            "shuffle": False,
            "config": {"seq_length": 48, "split": "1, 0, 0", "seed": 3, "create_attention_mask": True,
                       "create_compressed_eod_mask": False, "data_path": ["1", prefix],
                       "path_to_cache": str(tmp_path / "cache"), **config},
        },
        "drop_remainder": True,
        "num_parallel_workers": 2,
    }


def test_yaml_block_resumes_on_another_dp_size(tmp_path):
    prefix = _write_pair(str(tmp_path / "d"), _samples(150))
    block = _yaml(prefix, tmp_path)

    def stream(dp_size, consumed, steps):
        rows = []
        loaders = [build_from_yaml_block(block, dp_rank=r, dp_size=dp_size, micro_batch_size=2, consumed_samples=consumed)
                   for r in range(dp_size)]
        iters = [iter(x) for x in loaders]
        for _ in range(steps):
            for it in iters:
                rows.append(next(it)["input_ids"])
        return np.concatenate(rows), loaders[0].state_dict()

    full, _ = stream(1, 0, 18)
    head, state = stream(2, 0, 3)
    assert state == {"consumed_samples": 12}
    tail, _ = stream(4, state["consumed_samples"], 3)
    assert np.array_equal(np.concatenate([head, tail]), full)  # 12 + 24 rows, same global order
    batch = next(iter(build_from_yaml_block(block, micro_batch_size=2)))
    assert list(batch) == block["dataloader"]["column_names"] and batch["attention_mask"].shape == (2, 1, 48, 48)


@pytest.mark.parametrize(
    "config, message",
    [
        ({"eod": 1}, "eod: SFTDataset does not use eod"),
        ({"pad": -1}, "pad: SFTDataset pads rows with id 0"),
        ({"eod_mask_loss": True}, "loss-mask channel"),
        ({"reset_position_ids": False}, "reset_position_ids: SFTDataset always restarts position ids .* cannot be False"),
        ({"seq_lenght": 4}, "did you mean 'seq_length'"),
        ({"eod_pad_length": 1}, "eod_pad_length must be an integer >= 2"),
    ],
)
def test_sft_config_errors(tmp_path, config, message):
    with pytest.raises(DatasetConfigError, match=message):
        build_from_yaml_block(_yaml(str(tmp_path / "absent"), tmp_path, **config))


def test_sft_config_accepts_the_reset_switches_as_true(tmp_path):
    prefix = _write_pair(str(tmp_path / "d"), _samples(50))
    loader = build_from_yaml_block(_yaml(prefix, tmp_path, reset_position_ids=True, reset_attention_mask=True))
    assert isinstance(loader.dataset.datasets[0], SFTDataset)  # ["1", prefix]: a weighted blend of one, as in Megatron
    with pytest.raises(DatasetConfigError, match="needs a SFTDatasetConfig"):
        BlendedMegatronDatasetDataLoader(datasets_type="SFTDataset", sizes=[1, 0, 0], config=_gpt_config(prefix))


def _gpt_config(prefix):
    from mf_data import GPTDatasetConfig

    return GPTDatasetConfig(random_seed=1, sequence_length=8, blend=([prefix], None), split="1")
