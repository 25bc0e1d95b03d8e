"""GPTDataset samples (masks, positions, padding, compressed EOD mask), its epoch rules, and its
errors where Megatron would hang or crash."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from mf_data import (
    BlendedDataset,
    BlendedMegatronDatasetBuilder,
    DatasetConfigError,
    DatasetTooSmallError,
    GPTDataset,
    GPTDatasetConfig,
    IndexedDataset,
    Split,
    flatten_actual_seq_len,
)
from mf_data._reference import build_sample_idx_loop

EOD = 1


def _config(prefix, tmp_path, **kw):
    fields = dict(random_seed=3, sequence_length=8, blend=([prefix], None), split="1,0,0", eod=EOD,
                  path_to_cache=str(tmp_path / "cache"), create_attention_mask=False)
    fields.update(kw)
    return GPTDatasetConfig(**fields)


def _train(prefix, tmp_path, size=None, **kw):
    return BlendedMegatronDatasetBuilder(GPTDataset, [size, None, None], lambda: True, _config(prefix, tmp_path, **kw)).build()[0]


def _docs(rng, n, lo=2, hi=12):
    return [list(rng.integers(2, 100, size=int(rng.integers(lo, hi)))) + [EOD] for _ in range(n)]


def _megatron_masks(tokens, reset_position_ids, reset_attention_mask, eod_mask_loss):
    """Megatron's _get_ltor_masks_and_position_ids, loop for loop (numpy instead of torch)."""
    seq = tokens.size
    attention = np.tril(np.ones((seq, seq)))[None]
    loss = np.ones(seq, dtype=np.float32)
    if eod_mask_loss:
        loss[tokens == EOD] = 0.0
    position = np.arange(seq, dtype=np.int64)
    if reset_position_ids or reset_attention_mask:
        prev = 0
        for i in position[tokens == EOD].copy():
            if reset_attention_mask:
                attention[0, i + 1 :, : i + 1] = 0
            if reset_position_ids:
                position[i + 1 :] -= i + 1 - prev
                prev = i + 1
    return attention < 0.5, loss, position


@pytest.mark.parametrize("reset_pos, reset_attn, eod_loss", [(False, False, False), (True, True, True), (True, False, False), (False, True, True)])
def test_masks_and_positions_match_megatron(write_dataset, tmp_path, reset_pos, reset_attn, eod_loss):
    prefix = write_dataset(_docs(np.random.default_rng(0), 60))
    ds = _train(prefix, tmp_path, 50, sequence_length=16, create_attention_mask=True, reset_position_ids=reset_pos,
                reset_attention_mask=reset_attn, eod_mask_loss=eod_loss)
    batch = ds.get_batch(np.arange(len(ds)))
    assert batch["attention_mask"].shape == (len(ds), 1, 16, 16) and batch["attention_mask"].dtype == bool
    for i in range(len(ds)):
        attention, loss, position = _megatron_masks(batch["input_ids"][i], reset_pos, reset_attn, eod_loss)
        assert np.array_equal(batch["attention_mask"][i], attention)
        assert np.array_equal(batch["loss_mask"][i], loss)
        assert np.array_equal(batch["position_ids"][i], position)


def test_actual_seq_len_convention(write_dataset, tmp_path):
    # Documents of 3, 4 and 20 tokens (each ending in EOD); samples of 8 tokens.
    prefix = write_dataset([[5, 6, EOD], [7, 8, 9, EOD], list(range(10, 29)) + [EOD]])
    ds = _train(prefix, tmp_path, None, random_seed=0, create_compressed_eod_mask=True, eod_pad_length=4)
    for i in range(len(ds)):
        s = ds[i]
        tokens, asl = s["input_ids"], s["actual_seq_len"]
        ends = [j + 1 for j in np.flatnonzero(tokens == EOD) if j + 1 < 8]
        assert asl.dtype == np.int32 and asl.shape == (4,)
        assert asl.tolist() == ends + [8] * (4 - len(ends))
    # More documents than eod_pad_length - 1 boundaries: the tail merges, the last entry stays S.
    prefix = write_dataset([[5, EOD]] * 10, name="many")
    ds = _train(prefix, tmp_path, None, create_compressed_eod_mask=True, eod_pad_length=3)
    assert ds[0]["actual_seq_len"].tolist() == [2, 4, 8]
    flat = flatten_actual_seq_len(np.array([[2, 8, 8], [3, 8, 8]]), 8)
    assert flat.tolist() == [2, 8, 8, 11, 16, 16]


def test_pad_semantics_and_no_extra_token(write_dataset, tmp_path):
    # pad=5 appears in the data: Megatron masks its loss and maps its id to 0.
    prefix = write_dataset([[5, 6, 5, 7, EOD]] * 8)
    ds = _train(prefix, tmp_path, None, pad=5)
    s = ds[0]
    raw, _ = ds.read_text([0])
    assert np.array_equal(s["loss_mask"], (raw[0, 1:] != 5).astype(np.float32))
    assert not np.any(s["input_ids"] == 5) and not np.any(s["labels"] == 5)
    # add_extra_token_to_sequence=False: labels are the inputs shifted, the last one is pad -> 0.
    ds = _train(prefix, tmp_path, None, add_extra_token_to_sequence=False, sequence_length=5)
    sizes = ds.dataset.sequence_lengths
    assert np.array_equal(ds.sample_index, build_sample_idx_loop(sizes, ds.document_index, 5, 1, int(sizes.sum()), True, False))
    s = ds[0]
    assert s["labels"][-1] == 0 and s["loss_mask"][-1] == 0
    assert np.array_equal(s["labels"][:-1], s["input_ids"][1:])


def test_partial_validation_sequence_is_padded(write_dataset, tmp_path):
    prefix = write_dataset(_docs(np.random.default_rng(1), 40))
    cfg = _config(prefix, tmp_path, split="1,1,0", drop_last_partial_validation_sequence=False)
    _, valid, _ = BlendedMegatronDatasetBuilder(GPTDataset, [None, None, None], None, cfg).build()
    tokens = int(valid.dataset.sequence_lengths[valid.indices].sum())
    assert len(valid) == math.ceil((tokens - 1) / 8)
    # Megatron's walk gives the last sample whatever is left, then pads it (pad -1 -> id 0, no loss).
    last = valid[int(np.flatnonzero(valid.shuffle_index == len(valid) - 1)[0])]
    filled = tokens - (len(valid) - 1) * 8  # tokens left for the last window of 9
    assert 0 < filled < 9
    assert np.all(last["loss_mask"][: filled - 1] == 1) and np.all(last["loss_mask"][filled - 1 :] == 0)
    assert np.all(last["labels"][filled - 1 :] == 0) and np.all(last["input_ids"][filled:] == 0)
    # The batched reader (vectorised above 32 samples, a loop below) pads the same way.
    everything = valid.get_batch(np.arange(len(valid)))
    for i in range(len(valid)):
        assert all(np.array_equal(everything[k][i], v) for k, v in valid[i].items())


def test_unmapped_bin_files_give_the_same_samples(megatron_fixtures, tmp_path):
    def build(mmap):
        cfg = GPTDatasetConfig(random_seed=9, sequence_length=40, blend=([str(megatron_fixtures / "b_i32")], None), split="1",
                               eod=EOD, path_to_cache=str(tmp_path), create_attention_mask=False, mmap_bin_files=mmap)
        return BlendedMegatronDatasetBuilder(GPTDataset, [100, None, None], None, cfg).build()[0]

    mapped, unmapped = build(True), build(False)
    assert unmapped.dataset.token_array() is None
    for idxs in ([0], [3, 1, 4], list(range(len(mapped)))):
        a, b = mapped.get_batch(idxs), unmapped.get_batch(idxs)
        assert all(np.array_equal(a[k], b[k]) for k in a)


def test_padding_sample_and_getitem_none(write_dataset, tmp_path):
    ds = _train(write_dataset(_docs(np.random.default_rng(2), 30)), tmp_path, 20)
    pad = ds[None]
    assert np.array_equal(pad["input_ids"], ds[0]["input_ids"]) and not pad["loss_mask"].any()


def _separate_case(ratio_target):
    """Docs/sizes for which the final epoch holds about `ratio_target` of an epoch's samples."""
    n, length, seq = 40, 10, 8  # 400 tokens an epoch, (400 - 1) // 8 = 49 samples an epoch
    per_epoch = (n * length - 1) // seq
    sans_final = (2 * n * length - 1) // seq  # two full epochs before the last
    return n, length, seq, sans_final + int(ratio_target * per_epoch), per_epoch


@pytest.mark.parametrize("ratio, separate", [(0.5, True), (0.79, True), (0.81, False), (0.95, False)])
def test_separate_final_epoch_threshold(write_dataset, tmp_path, ratio, separate):
    n, length, seq, num_samples, per_epoch = _separate_case(ratio)
    prefix = write_dataset([[2] * (length - 1) + [EOD]] * n)
    ds = _train(prefix, tmp_path, num_samples, sequence_length=seq, random_seed=11)
    replay = np.random.RandomState(11)
    docs = np.arange(n, dtype=np.int32)
    if separate:
        head = np.tile(docs, 2)
        replay.shuffle(head)
        tail = docs.copy()
        replay.shuffle(tail)
        expected = np.concatenate([head, tail])
    else:
        expected = np.tile(docs, 3)
        replay.shuffle(expected)
    assert np.array_equal(ds.document_index, expected)
    assert len(ds) >= num_samples


def test_direct_construction_like_megatron(megatron_fixtures, tmp_path):
    cfg = GPTDatasetConfig(random_seed=1, sequence_length=16, blend=([str(megatron_fixtures / "a_u16")], None), split="1",
                           eod=EOD, path_to_cache=str(tmp_path), create_attention_mask=False)
    low = GPTDataset.build_low_level_dataset(str(megatron_fixtures / "a_u16"), cfg)
    assert isinstance(low, IndexedDataset) and GPTDataset.numel_low_level_dataset(low) == 300
    ds = GPTDataset(low, "a", np.arange(100, 200, dtype=np.int32), 50, Split.train, cfg)
    assert len(ds) >= 50 and set(np.unique(ds.document_index)) == set(range(100, 200))
    again = pickle.loads(pickle.dumps(ds))
    assert np.array_equal(again[3]["input_ids"], ds[3]["input_ids"])


# --- errors instead of hangs and crashes ----------------------------------------------------------


def test_split_without_documents(megatron_fixtures, tmp_path):
    cfg = GPTDatasetConfig(random_seed=1, sequence_length=16, blend=([str(megatron_fixtures / "a_u16")], None),
                           split="969,30,1", eod=EOD, path_to_cache=str(tmp_path), create_attention_mask=False)
    # Megatron loops forever here (no tokens, samples requested).
    with pytest.raises(DatasetTooSmallError, match="test split.*no tokens in its 0 documents"):
        BlendedMegatronDatasetBuilder(GPTDataset, [10, 10, 5], None, cfg).build()
    # Asked for nothing, the empty split is simply empty (as in the reference case "single").
    train, valid, test = BlendedMegatronDatasetBuilder(GPTDataset, [10, 10, None], None, cfg).build()
    assert len(test) == 0
    with pytest.raises(IndexError):
        test.get_batch([0])


def test_dataset_too_small_for_a_sample_in_a_blend(write_dataset, tmp_path):
    big = write_dataset(_docs(np.random.default_rng(3), 50), name="big")
    tiny = write_dataset([[2, 3, EOD]], name="tiny")
    cfg = GPTDatasetConfig(random_seed=1, sequence_length=8, blend=([big, tiny], None), split="1", eod=EOD,
                           path_to_cache=str(tmp_path / "c"), create_attention_mask=False)
    with pytest.raises(DatasetTooSmallError, match="tiny.*too small for one sample of 8 tokens"):
        BlendedMegatronDatasetBuilder(GPTDataset, [None, None, None], None, cfg).build()


@pytest.mark.parametrize("weights, message", [([0.5, 0.0], "> 0"), ([1.0, -2.0], "> 0"), ([float("nan"), 1.0], "> 0"), ([1.0], "pair up")])
def test_bad_blend_weights(megatron_fixtures, weights, message):
    with pytest.raises(DatasetConfigError, match=message):
        GPTDatasetConfig(random_seed=1, sequence_length=8, split="1", eod=EOD,
                         blend=([str(megatron_fixtures / "a_u16"), str(megatron_fixtures / "b_i32")], weights))


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"split": "-1,1"}, "only non-negative"),
        ({"split": "0,0,0"}, "sum to more than 0"),
        ({"split": "1,1,1,1"}, "at most 3"),
        ({"pad": EOD}, "equals eod"),
        ({"eod": None, "eod_mask_loss": True}, "needs the end-of-document id"),
        ({"reset_attention_mask": True}, "only shapes an attention mask"),
        ({"sequence_length": 0}, "sequence_length"),
        ({"random_seed": -1}, "random_seed"),
        ({"blend": None}, "no data"),
        ({"split": None}, "split must be given"),
        ({"mid_level_dataset_surplus": float("inf")}, "mid_level_dataset_surplus"),
    ],
)
def test_config_errors(megatron_fixtures, overrides, message):
    fields = dict(random_seed=1, sequence_length=8, split="1", eod=EOD, create_attention_mask=False,
                  blend=([str(megatron_fixtures / "a_u16")], None))
    fields.update(overrides)
    with pytest.raises(DatasetConfigError, match=message):
        GPTDatasetConfig(**fields)


def test_builder_argument_errors(megatron_fixtures):
    cfg = GPTDatasetConfig(random_seed=1, sequence_length=8, split="8,1,1", eod=EOD, create_attention_mask=False,
                           blend=([str(megatron_fixtures / "a_u16"), str(megatron_fixtures / "b_i32")], [1, 2]))
    with pytest.raises(DatasetConfigError, match="needs 3 entries"):
        BlendedMegatronDatasetBuilder(GPTDataset, [10, 10], None, cfg)
    with pytest.raises(DatasetConfigError, match="valid split has blend weights but no size"):
        BlendedMegatronDatasetBuilder(GPTDataset, [10, None, 5], None, cfg)
    with pytest.raises(DatasetConfigError, match="integer >= 0"):
        BlendedMegatronDatasetBuilder(GPTDataset, [-1, 1, 1], None, cfg)


def test_blend_oversampling_is_reported(megatron_fixtures, tmp_path):
    a, b = str(megatron_fixtures / "a_u16"), str(megatron_fixtures / "b_i32")
    cfg = GPTDatasetConfig(random_seed=1, sequence_length=8, split="1", eod=EOD, path_to_cache=str(tmp_path),
                           create_attention_mask=False, blend=([a, b], None))
    train = BlendedMegatronDatasetBuilder(GPTDataset, [None, None, None], None, cfg).build()[0]
    inner = [len(d) for d in train.datasets]
    with pytest.raises(DatasetTooSmallError, match="mid_level_dataset_surplus"):
        BlendedDataset(train.datasets, [1.0, 1.0], sum(inner) * 2, cfg)


def test_blend_per_split_matches_the_same_blend_split_one_way(megatron_fixtures, tmp_path):
    a, b = str(megatron_fixtures / "a_u16"), str(megatron_fixtures / "b_i32")
    common = dict(random_seed=4, sequence_length=20, eod=EOD, create_attention_mask=False, path_to_cache=str(tmp_path))
    per_split = GPTDatasetConfig(blend_per_split=[([a, b], [0.4, 0.6]), ([b], None), None], **common)
    train, valid, test = BlendedMegatronDatasetBuilder(GPTDataset, [200, 30, None], None, per_split).build()
    assert test is None and isinstance(train, BlendedDataset) and isinstance(valid, GPTDataset)
    whole = GPTDatasetConfig(blend=([a, b], [0.4, 0.6]), split="1", **common)
    same = BlendedMegatronDatasetBuilder(GPTDataset, [200, 0, 0], None, whole).build()[0]
    assert np.array_equal(train.dataset_index, same.dataset_index)
    assert np.array_equal(train.get_batch(np.arange(len(train)))["labels"], same.get_batch(np.arange(len(same)))["labels"])
    single = GPTDatasetConfig(blend=([b], None), split="1", **common)
    alone = BlendedMegatronDatasetBuilder(GPTDataset, [30, None, None], None, single).build()[0]
    assert np.array_equal(valid.shuffle_index, alone.shuffle_index) and len(valid) == len(alone)


def test_unweighted_blends_follow_dataset_sizes(megatron_fixtures, tmp_path):
    a, b = str(megatron_fixtures / "a_u16"), str(megatron_fixtures / "b_i32")
    cfg = GPTDatasetConfig(random_seed=4, sequence_length=20, eod=EOD, create_attention_mask=False, path_to_cache=str(tmp_path),
                           blend=([a, b], None), split="1")
    exhaustive = BlendedMegatronDatasetBuilder(GPTDataset, [None, None, None], None, cfg).build()[0]
    lengths = [len(d) for d in exhaustive.datasets]
    assert len(exhaustive) == sum(lengths) and np.bincount(exhaustive.dataset_index).tolist() == lengths
    capped = BlendedMegatronDatasetBuilder(GPTDataset, [100, None, None], None, cfg).build()[0]
    assert len(capped) == 100 and capped.weights == pytest.approx([n / sum(lengths) for n in lengths])
