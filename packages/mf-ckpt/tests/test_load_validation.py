"""Bad checkpoints: one clear error, raised before any destination buffer is touched."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from mf_ckpt import CheckpointError, LoadOptions, ShardedTensor, load, run_threaded, save, shard_array

W = np.arange(12 * 4, dtype=np.float32).reshape(12, 4)
B = np.arange(5, dtype=np.int32)
SENTINEL = -1.0


@pytest.fixture
def ckpt(tmp_path) -> Path:
    run_threaded(2, lambda c: save(str(tmp_path / "ck"), 7, {"w": shard_array(W, 0, c.rank, 2), "b": B}, comm=c))
    return tmp_path / "ck"


def dests():
    return {"w": np.full((12, 4), SENTINEL, np.float32), "b": np.full(5, -1, np.int32)}


def assert_fails_cleanly(path, message, **kwargs):
    out = dests()
    with pytest.raises(CheckpointError, match=message) as info:
        load(str(path), out, **kwargs)
    assert "\n" not in str(info.value)
    assert (out["w"] == SENTINEL).all() and (out["b"] == -1).all()  # nothing half-loaded


def meta_path(ckpt: Path) -> Path:
    return ckpt / "iteration_00000007" / "metadata.json"


def edit_meta(ckpt: Path, fn) -> None:
    meta = json.loads(meta_path(ckpt).read_text())
    fn(meta)
    meta_path(ckpt).write_text(json.dumps(meta))


def test_good_checkpoint_loads(ckpt):
    out = dests()
    assert load(str(ckpt), out).iteration == 7
    assert np.array_equal(out["w"], W) and np.array_equal(out["b"], B)


def test_missing_file(ckpt):
    (ckpt / "iteration_00000007" / "checkpoint-model-0000001-0000002.safetensors").unlink()
    assert_fails_cleanly(ckpt, r"file 'checkpoint-model-0000001-0000002.safetensors' \(holding model tensor 'w'\) is missing")


def test_truncated_file(ckpt):
    f = ckpt / "iteration_00000007" / "checkpoint-model-0000001-0000002.safetensors"
    f.write_bytes(f.read_bytes()[:-8])
    assert_fails_cleanly(ckpt, "truncated")


def test_garbage_file(ckpt):
    f = ckpt / "iteration_00000007" / "checkpoint-model-0000000-0000002.safetensors"
    f.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    assert_fails_cleanly(ckpt, "header is not valid JSON")


@pytest.mark.parametrize("name", ["../outside.safetensors", "/etc/passwd", "sub/dir.safetensors", ".."])
def test_file_names_must_stay_inside_the_directory(ckpt, name):
    edit_meta(ckpt, lambda m: m["model"]["w"]["chunks"][0].update(file=name))
    assert_fails_cleanly(ckpt, "not a plain file name|invalid file name")


def test_symlink_escaping_the_directory(ckpt, tmp_path):
    outside = tmp_path / "outside.safetensors"
    shutil.copy(ckpt / "iteration_00000007" / "checkpoint-model-0000000-0000002.safetensors", outside)
    (ckpt / "iteration_00000007" / "link.safetensors").symlink_to(outside)
    edit_meta(ckpt, lambda m: m["model"]["w"]["chunks"][0].update(file="link.safetensors"))
    assert_fails_cleanly(ckpt, "resolves outside the checkpoint directory")


def test_dtype_in_metadata_disagrees_with_the_file(ckpt):
    edit_meta(ckpt, lambda m: m["model"]["b"].update(dtype="I64"))
    out = {"b": np.full(5, -1, np.int64)}
    with pytest.raises(CheckpointError, match="tensor 'b' is I32, metadata says I64"):
        load(str(ckpt), out)
    assert (out["b"] == -1).all()


def test_shape_in_metadata_disagrees_with_the_file(ckpt):
    def grow(m):
        m["model"]["w"]["shape"] = [14, 4]
        m["model"]["w"]["chunks"][1]["shape"] = [8, 4]

    edit_meta(ckpt, grow)
    out = {"w": np.full((14, 4), SENTINEL, np.float32)}
    with pytest.raises(CheckpointError, match=r"has shape \[6, 4\], metadata says \[8, 4\]"):
        load(str(ckpt), out)
    assert (out["w"] == SENTINEL).all()


def test_chunks_must_cover_the_tensor(ckpt):
    edit_meta(ckpt, lambda m: m["model"]["w"]["chunks"].pop())
    assert_fails_cleanly(ckpt, r"'w' is not fully covered by its chunks \(nothing stored at \[6, 0\]\)")


def test_chunks_must_not_overlap_or_leave_the_tensor(ckpt):
    edit_meta(ckpt, lambda m: m["model"]["w"]["chunks"][1].update(offset=[5, 0]))
    assert_fails_cleanly(ckpt, "lies outside|overlapping")
    edit_meta(ckpt, lambda m: m["model"]["w"]["chunks"][1].update(offset=[4, 0], shape=[6, 4]))
    assert_fails_cleanly(ckpt, "overlapping chunks")


def test_malformed_metadata(ckpt):
    meta_path(ckpt).write_text("{not json")
    assert_fails_cleanly(ckpt, "metadata.json is not valid JSON")
    meta_path(ckpt).write_text(json.dumps({"format": "something-else"}))
    assert_fails_cleanly(ckpt, "not an mf-ckpt metadata file")
    meta_path(ckpt).write_text(json.dumps({"format": "mf-ckpt", "format_version": 1,
                                           "model": {"w": {"dtype": "F32", "shape": [12, -4], "chunks": []}}}))
    assert_fails_cleanly(ckpt, "shape must be a list of non-negative integers")


def test_destination_mismatches(ckpt):
    out = {"w": np.full((12, 5), SENTINEL, np.float32), "b": np.full(5, -1, np.int32)}
    with pytest.raises(CheckpointError, match=r"'w' has shape \[12, 4\], destination global shape \[12, 5\]"):
        load(str(ckpt), out)
    ro = np.zeros((12, 4), np.float32)
    ro.flags.writeable = False
    with pytest.raises(CheckpointError, match="destination array is read-only"):
        load(str(ckpt), {"w": ro})


def test_marker_problems(ckpt):
    (ckpt / "latest_checkpointed_iteration.txt").write_text("seven")
    assert_fails_cleanly(ckpt, r"does not hold an iteration number \(expected up to 18 ASCII digits, found something else\)$")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("8\n")
    assert_fails_cleanly(ckpt, "checkpoint directory iteration_00000008 is missing")
    assert_fails_cleanly(ckpt / "nowhere", "does not exist")
    assert_fails_cleanly(ckpt, "iteration_00000009 is missing", iteration=9)
    out = dests()
    load(str(ckpt), out, iteration=7)  # an explicit iteration bypasses the marker
    load(str(ckpt / "iteration_00000007"), out)  # and so does the iteration directory itself


def test_not_a_checkpoint(tmp_path):
    (tmp_path / "empty").mkdir()
    assert_fails_cleanly(tmp_path / "empty", "not a checkpoint")


def test_one_bad_rank_fails_every_rank_before_any_read(ckpt):
    def body(comm):
        shape = (6, 4) if comm.rank == 0 else (6, 5)  # rank 1 asks for a wrong global shape
        dest = ShardedTensor(np.full(shape, SENTINEL, np.float32), (12, shape[1]), (6 * comm.rank, 0))
        try:
            load(LoadOptions(load_path=str(ckpt)), {"w": dest}, comm=comm)
        except CheckpointError as e:
            return str(e), bool((dest.data == SENTINEL).all())
        return None

    results = run_threaded(2, body)
    assert all(r is not None and r[0].startswith("rank 1: ") and r[1] for r in results)
