"""The index cache: Megatron-style names, reuse through memory maps, atomic writes, rebuilds of
corrupt files, and ranks that wait for the building rank (or give up with a clear error)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time

import numpy as np
import pytest

from mf_data import BlendedMegatronDatasetBuilder, CacheTimeoutError, GPTDataset, GPTDatasetConfig


def _config(prefixes, cache, weights=None, **kw):
    return GPTDatasetConfig(random_seed=5, sequence_length=32, blend=(prefixes, weights), split="9,1,0", eod=1,
                            path_to_cache=None if cache is None else str(cache), create_attention_mask=False, **kw)


def _build(config, sizes=(200, 10, None), rank=None):
    return BlendedMegatronDatasetBuilder(GPTDataset, list(sizes), rank, config).build()


def test_files_are_named_from_the_description_hash(megatron_fixtures, tmp_path):
    train, valid, _ = _build(_config([str(megatron_fixtures / "a_u16")], tmp_path))
    names = sorted(os.listdir(tmp_path))
    assert len(names) == 8 and not [n for n in names if ".tmp-" in n]
    for ds, split, requested in ((train, "train", 200), (valid, "valid", 10)):
        base = f"{ds.unique_description_hash}-GPTDataset-{split}"
        text = (tmp_path / f"{base}-description.txt").read_text()
        assert hashlib.md5(text.encode()).hexdigest() == ds.unique_description_hash
        desc = json.loads(text)
        assert (desc["class"], desc["index_split"], desc["num_samples"]) == ("GPTDataset", split, requested)
        assert desc["random_seed"] == 5 and desc["sequence_length"] == 32 and desc["split"] == "9,1,0"
        for name in ("document_index", "sample_index", "shuffle_index"):
            assert np.array_equal(np.load(tmp_path / f"{base}-{name}.npy"), getattr(ds, name))


def test_second_build_memory_maps_the_cache(megatron_fixtures, tmp_path):
    first = _build(_config([str(megatron_fixtures / "a_u16")], tmp_path))[0]
    stamps = {p: os.stat(tmp_path / p).st_mtime_ns for p in os.listdir(tmp_path)}
    second = _build(_config([str(megatron_fixtures / "a_u16")], tmp_path))[0]
    assert isinstance(second.sample_index, np.memmap)
    assert {p: os.stat(tmp_path / p).st_mtime_ns for p in os.listdir(tmp_path)} == stamps
    assert np.array_equal(first.shuffle_index, second.shuffle_index)
    # A different seed is a different description: new files, old ones untouched.
    other = _config([str(megatron_fixtures / "a_u16")], tmp_path)
    other.random_seed = 6
    _build(other)
    assert len(os.listdir(tmp_path)) == 16


@pytest.mark.parametrize("damage", ["truncate", "garbage", "wrong_shape", "no_description"])
def test_corrupt_cache_is_rebuilt(megatron_fixtures, tmp_path, damage):
    good = _build(_config([str(megatron_fixtures / "a_u16")], tmp_path))[0]
    base = tmp_path / f"{good.unique_description_hash}-GPTDataset-train"
    target = f"{base}-sample_index.npy"
    if damage == "truncate":
        with open(target, "r+b") as f:
            f.truncate(200)
    elif damage == "garbage":
        with open(target, "wb") as f:
            f.write(b"not a numpy file at all")
    elif damage == "wrong_shape":
        np.save(target, np.zeros((3, 2), dtype=np.int32))
    else:
        os.remove(f"{base}-description.txt")
    again = _build(_config([str(megatron_fixtures / "a_u16")], tmp_path))[0]
    assert np.array_equal(again.sample_index, good.sample_index)
    assert np.array_equal(np.load(target), good.sample_index)


def test_non_building_rank_times_out_clearly(megatron_fixtures, tmp_path):
    cfg = _config([str(megatron_fixtures / "a_u16")], tmp_path, cache_wait_timeout=0.3)
    started = time.monotonic()
    with pytest.raises(CacheTimeoutError, match=r"gave up after 0\.3 s .*is_built_on_rank\(\) is False"):
        _build(cfg, rank=lambda: False)
    assert time.monotonic() - started < 5


def test_non_building_rank_waits_for_the_builder(megatron_fixtures, tmp_path):
    prefixes = [str(megatron_fixtures / "a_u16"), str(megatron_fixtures / "b_i32")]
    result = {}

    def follower():
        result["datasets"] = _build(_config(prefixes, tmp_path, [0.4, 0.6], cache_wait_timeout=60), rank=lambda: False)

    t = threading.Thread(target=follower)
    t.start()
    time.sleep(0.3)
    assert "datasets" not in result  # still waiting: nothing has been written yet
    built = _build(_config(prefixes, tmp_path, [0.4, 0.6]), rank=lambda: True)
    t.join(30)
    waited = result["datasets"]
    assert np.array_equal(waited[0].dataset_index, built[0].dataset_index)
    assert isinstance(waited[0].dataset_index, np.memmap)
    assert np.array_equal(waited[0].datasets[1].shuffle_index, built[0].datasets[1].shuffle_index)


def test_default_cache_lives_next_to_the_data(megatron_fixtures, tmp_path):
    for ext in (".bin", ".idx"):
        shutil.copy(megatron_fixtures / f"a_u16{ext}", tmp_path / f"a_u16{ext}")
    _build(_config([str(tmp_path / "a_u16")], None))
    assert len(os.listdir(tmp_path / "a_u16" / "cache" / "GPTDataset_indices")) == 8


def test_unwritable_default_location_builds_in_memory(megatron_fixtures, tmp_path, caplog):
    for ext in (".bin", ".idx"):
        shutil.copy(megatron_fixtures / f"a_u16{ext}", tmp_path / f"a_u16{ext}")
    (tmp_path / "a_u16").write_text("a file where the cache directory would go")
    train = _build(_config([str(tmp_path / "a_u16")], None))[0]
    assert len(train) >= 200 and "building the train indices in memory" in caplog.text
    assert sorted(os.listdir(tmp_path)) == ["a_u16", "a_u16.bin", "a_u16.idx"]
