"""The framework-free loader: Megatron's sampler order, resumption on another data-parallel size,
prefetching workers, column selection, and the YAML block."""

from __future__ import annotations

import numpy as np
import pytest

from mf_data import DatasetConfigError, DatasetTooSmallError
from mf_data.loader import BlendedMegatronDatasetDataLoader, build_from_yaml_block
from mf_data.sampler import MegatronPretrainingSampler


@pytest.fixture
def config(megatron_fixtures, tmp_path):
    return {
        "seq_length": 24,
        "split": "1, 0, 0",
        "eod": 1,
        "pad": -1,
        "create_attention_mask": False,
        "create_compressed_eod_mask": False,
        "data_path": ["0.3", str(megatron_fixtures / "a_u16"), "0.7", str(megatron_fixtures / "b_i32")],
        "path_to_cache": str(tmp_path / "cache"),
        "seed": 42,
    }


def _loader(config, **kw):
    kw.setdefault("num_parallel_workers", 2)
    kw.setdefault("datasets_type", "GPTDataset")
    return BlendedMegatronDatasetDataLoader(sizes=[120, 0, 0], config=config, **kw)


def _global_sequence(config, dp_size, micro, consumed=0, steps=None, **kw):
    """What all ranks yield, step by step, laid end to end (rank order within a step)."""
    per_rank = []
    for rank in range(dp_size):
        loader = _loader(config, dp_rank=rank, dp_size=dp_size, micro_batch_size=micro, consumed_samples=consumed, **kw)
        batches = []
        for batch in loader:
            batches.append(batch["input_ids"])
            if steps is not None and len(batches) == steps:
                break
        per_rank.append((batches, loader.state_dict()["consumed_samples"]))
    n_steps = len(per_rank[0][0])
    rows = [per_rank[r][0][k] for k in range(n_steps) for r in range(dp_size)]
    return np.concatenate(rows) if rows else np.zeros((0, 24)), per_rank[0][1]


def test_order_is_megatron_pretraining_sampler_order(config):
    loader = _loader(config, dp_rank=1, dp_size=2, micro_batch_size=3, consumed_samples=6)
    expected = list(MegatronPretrainingSampler(len(loader.dataset), 6, 3, 1, 2))
    assert expected[0] == [9, 10, 11] and len(loader) == len(expected) == (120 - 6) // 6
    for batch, indices in zip(loader, expected):
        want = loader.dataset.get_batch(indices)
        assert all(np.array_equal(batch[c], want[c]) for c in loader.columns)
    assert loader.state_dict() == {"consumed_samples": 6 + 6 * len(expected)}


def test_resuming_on_another_dp_size_continues_the_same_global_order(config):
    straight, _ = _global_sequence(config, dp_size=1, micro=4)
    first, consumed = _global_sequence(config, dp_size=2, micro=2, steps=5)  # 5 steps of 2 x 2
    assert consumed == 20
    rest, end = _global_sequence(config, dp_size=3, micro=2, consumed=consumed)  # steps of 3 x 2
    assert end == 20 + 6 * ((120 - 20) // 6)
    joined = np.concatenate([first, rest])
    assert np.array_equal(joined, straight[: len(joined)])
    assert len(joined) == 116 and len(straight) == 120


def test_state_dict_round_trip_and_len(config):
    loader = _loader(config, micro_batch_size=4)
    it = iter(loader)
    seen = [next(it)["labels"] for _ in range(3)]
    state = loader.state_dict()
    assert state == {"consumed_samples": 12}
    fresh = _loader(config, micro_batch_size=4)
    fresh.load_state_dict(state)
    assert len(fresh) == (120 - 12) // 4
    assert np.array_equal(next(iter(fresh))["labels"], next(it)["labels"])
    fresh.load_state_dict({"consumed_samples": 0})
    assert np.array_equal(next(iter(fresh))["labels"], seen[0])
    with pytest.raises(DatasetConfigError, match="exceeds"):
        fresh.load_state_dict({"consumed_samples": 121})
    with pytest.raises(DatasetConfigError, match="unknown keys"):
        fresh.load_state_dict({"consumed_samples": 1, "epoch": 2})


def test_workers_threads_and_processes_agree(config):
    sync, _ = _global_sequence(config, dp_size=1, micro=5, num_parallel_workers=0)
    threads, _ = _global_sequence(config, dp_size=1, micro=5, num_parallel_workers=3, prefetch_size=2)
    procs, _ = _global_sequence(config, dp_size=1, micro=5, num_parallel_workers=2, python_multiprocessing=True)
    assert np.array_equal(sync, threads) and np.array_equal(sync, procs)


def test_drop_remainder_false_pads_the_last_step(config):
    loader = _loader(config, micro_batch_size=7, dp_size=2, dp_rank=1, drop_remainder=False)
    batches = list(loader)
    assert len(batches) == -(-120 // 14)
    last = batches[-1]
    # 120 = 8 * 14 + 8: rank 1 gets samples 119 (one real) and six padding rows with no loss.
    assert last["input_ids"].shape == (7, 24)
    assert last["loss_mask"][0].any() and not last["loss_mask"][1:].any()
    assert loader.state_dict()["consumed_samples"] == 120
    with pytest.raises(DatasetTooSmallError, match="fewer than one step"):
        _loader(config, micro_batch_size=61, dp_size=2)


def test_shuffle_true_is_a_fixed_permutation_of_the_global_order(config):
    plain, _ = _global_sequence(config, dp_size=1, micro=4)
    shuffled, _ = _global_sequence(config, dp_size=1, micro=4, shuffle=True)
    again, _ = _global_sequence(config, dp_size=2, micro=2, shuffle=True)
    assert not np.array_equal(plain, shuffled) and np.array_equal(shuffled, again)
    assert sorted(map(bytes, plain)) == sorted(map(bytes, shuffled))


def test_columns_select_and_order(config):
    loader = _loader(config, column_names=["labels", "input_ids"], micro_batch_size=2)
    batch = next(iter(loader))
    assert list(batch) == ["labels", "input_ids"]
    assert batch["input_ids"].dtype == np.int64 and batch["input_ids"].shape == (2, 24)
    cfg = dict(config, create_attention_mask=True, create_compressed_eod_mask=True, reset_attention_mask=True, eod_pad_length=16)
    loader = _loader(cfg, micro_batch_size=2)
    batch = next(iter(loader))
    assert batch["attention_mask"].shape == (2, 1, 24, 24) and batch["actual_seq_len"].shape == (2, 16)
    assert batch["loss_mask"].dtype == np.float32 and batch["position_ids"].dtype == np.int64


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"column_names": ["input_ids", "tokens"]}, "unknown column 'tokens'"),
        ({"column_names": ["input_ids", "attention_mask"]}, "create_attention_mask is False"),
        ({"column_names": ["input_ids", "input_ids"]}, "listed twice"),
        ({"numa_enable": True}, "numa_enable"),
        ({"datasets_type": "BertDataset"}, "one of GPTDataset, SFTDataset is supported"),
        ({"type": "HFDataLoader"}, "BlendedMegatronDatasetDataLoader"),
        ({"dp_rank": 2, "dp_size": 2}, "below dp_size"),
        ({"prefetch_size": 0}, "prefetch_size"),
        ({"python_multiprocessing": True, "num_parallel_workers": 0}, "num_parallel_workers >= 1"),
        ({"shuffle": "yes"}, "shuffle must be true or false"),
    ],
)
def test_loader_argument_errors(config, kwargs, message):
    kwargs.setdefault("micro_batch_size", 2)
    with pytest.raises(DatasetConfigError, match=message):
        _loader(config, **kwargs)


def test_listing_a_created_column_is_required(config):
    with pytest.raises(DatasetConfigError, match="create_attention_mask is True but column_names does not list"):
        _loader(dict(config, create_attention_mask=True), column_names=["input_ids", "labels"])


def test_unknown_config_key_is_rejected_with_a_suggestion(config):
    with pytest.raises(DatasetConfigError, match=r"config\.seq_lenght: unknown key \(did you mean 'seq_length'\?\)"):
        _loader(dict(config, seq_lenght=8))
    with pytest.raises(DatasetConfigError, match="S3"):
        _loader(dict(config, s3_cache_path="s3://bucket"))


def test_build_from_the_seed_yaml_block(megatron_fixtures, tmp_path):
    block = {
        "dataloader": {
            "type": "BlendedMegatronDatasetDataLoader",
            "datasets_type": "GPTDataset",
            "sizes": [40, 0, 0],
            "column_names": ["input_ids", "labels", "loss_mask", "position_ids"],
            "shuffle": False,
            "config": {
                "seq_length": 16, "split": "1, 0, 0", "eod": 1, "pad": -1, "create_attention_mask": False,
                "create_compressed_eod_mask": False, "data_path": ["1", str(megatron_fixtures / "a_u16")],
                "path_to_cache": str(tmp_path),
            },
        },
        "drop_remainder": True,
        "num_parallel_workers": 8,
        "prefetch_size": 1,
    }
    loader = build_from_yaml_block(block, dp_rank=0, dp_size=2, micro_batch_size=2, consumed_samples=4)
    assert loader.dataset.weights == [1.0] and len(loader.dataset) == 40  # ['1', prefix] is a blend, as in Megatron
    assert len(loader) == 9 and loader.dataset.config.random_seed == 1234
    with pytest.raises(DatasetConfigError, match=r"train_dataset\.num_workers: unknown key \(did you mean 'num_parallel_workers'\?\)"):
        build_from_yaml_block({**block, "num_workers": 2})
    bad = {**block, "dataloader": {**block["dataloader"], "config": {**block["dataloader"]["config"], "data_path": ["0", "x"]}}}
    with pytest.raises(DatasetConfigError, match=r"train_dataset\.dataloader\.config.*weight of 'x' must be finite and > 0"):
        build_from_yaml_block(bad)


def test_per_split_data_paths_and_valid_phase(megatron_fixtures, tmp_path):
    cfg = {"seq_length": 16, "eod": 1, "create_attention_mask": False, "path_to_cache": str(tmp_path),
           "train_data_path": ["1", str(megatron_fixtures / "a_u16"), "2", str(megatron_fixtures / "b_i32")],
           "valid_data_path": [str(megatron_fixtures / "b_i32")]}
    valid = BlendedMegatronDatasetDataLoader(sizes=[50, 20, None], config=cfg, phase="valid", micro_batch_size=4, num_parallel_workers=0)
    assert len(valid.dataset) >= 20 and len(valid) == len(valid.dataset) // 4
    with pytest.raises(DatasetConfigError, match="mutually exclusive"):
        _loader(dict(cfg, data_path=[str(megatron_fixtures / "a_u16")], split="1"))
    with pytest.raises(DatasetTooSmallError, match="test split is empty"):
        BlendedMegatronDatasetDataLoader(sizes=[50, 20, None], config=cfg, phase="test")
