"""Save on N simulated ranks, load on M with another split layout; options honoured."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

import mf_ckpt
from mf_ckpt import (
    CheckpointError,
    LoadOptions,
    SaveOptions,
    Saver,
    ShardedTensor,
    load,
    replicated,
    run_threaded,
    save,
    shard_array,
)

rng = np.random.default_rng(7)
GLOBAL = {
    "tok_embeddings.weight": rng.standard_normal((13, 8)).astype(np.float32),
    "layers.0.attention.wq.weight": rng.standard_normal((8, 6)).astype(np.float32),
    "norm.weight": rng.standard_normal(8).astype(np.float32),
    "moe.experts.w1": rng.standard_normal((5, 3, 4)).astype(np.float32),
    "counter": np.array(42, dtype=np.int64),
    "half": rng.standard_normal((6, 4)).astype(np.float16),
    "bf": mf_ckpt.bf16_from_float32(rng.standard_normal((7, 2)).astype(np.float32)),
}
OPT = {"exp_avg." + k: (v * 2 if v.dtype.kind == "f" else v) for k, v in GLOBAL.items() if k != "bf"}

# How each tensor is distributed: ("split", axis), ("pad", axis) or ("rep",).
LAYOUT_A = {"tok_embeddings.weight": ("split", 0), "layers.0.attention.wq.weight": ("split", 1),
            "norm.weight": ("rep",), "moe.experts.w1": ("pad", 0), "counter": ("rep",),
            "half": ("pad", 1), "bf": ("split", 0)}
LAYOUT_B = {"tok_embeddings.weight": ("pad", 1), "layers.0.attention.wq.weight": ("split", 0),
            "norm.weight": ("split", 0), "moe.experts.w1": ("split", 2), "counter": ("rep",),
            "half": ("rep",), "bf": ("pad", 1)}


def piece(arr, how, rank, world, fill=None):
    if how[0] == "rep" or arr.ndim == 0:
        st = replicated(arr.copy(), replica_id=rank)
    else:
        st = shard_array(arr, how[1], rank, world, padded=how[0] == "pad")
        st = ShardedTensor(st.data.copy(), st.global_shape, st.global_offset, st.replica_id)
    if fill is not None:
        if st.data.dtype.fields:  # raw BF16: fill the bits
            bits = st.data.dtype.itemsize * 8
            st.data.view(f"u{st.data.dtype.itemsize}")[...] = fill % 2**bits
        else:
            st.data[...] = fill
    return st


def state(glob, layout, rank, world, fill=None):
    return {k: piece(v, layout[k.removeprefix("exp_avg.")], rank, world, fill) for k, v in glob.items()}


def assemble(pieces: list[ShardedTensor]) -> np.ndarray:
    out = np.zeros(pieces[0].global_shape, pieces[0].data.dtype)
    for p in pieces:
        out[tuple(slice(o, o + n) for o, n in zip(p.global_offset, p.chunk_shape))] = p.chunk
    return out


def save_world(path, world, iteration=1, layout=LAYOUT_A, optim=True, **opts):
    def body(comm):
        return save(SaveOptions(save_path=str(path), **opts), iteration, state(GLOBAL, layout, comm.rank, world),
                    state(OPT, layout, comm.rank, world) if optim else None,
                    common={"step": iteration, "rng": np.random.RandomState(3).get_state()},
                    per_rank={"rank": comm.rank}, comm=comm)

    return run_threaded(world, body)


def load_world(path, world, layout=LAYOUT_B, optim=True, fill=0, **opts):
    def body(comm):
        model = state(GLOBAL, layout, comm.rank, world, fill)
        opt = state(OPT, layout, comm.rank, world, fill) if optim else None
        result = load(LoadOptions(load_path=str(path), **opts), model, opt, comm=comm)
        return model, opt, result

    return run_threaded(world, body)


def check_loaded(results, optim=True):
    for name, arr in GLOBAL.items():
        got = assemble([r[0][name] for r in results])
        assert got.tobytes() == arr.tobytes(), name
    if optim:
        for name, arr in OPT.items():
            assert assemble([r[1][name] for r in results]).tobytes() == arr.tobytes(), name


@pytest.mark.parametrize("save_ranks,load_ranks", [(4, 1), (4, 3), (2, 5), (3, 8), (1, 2)])
def test_reshard_on_load(tmp_path, save_ranks, load_ranks):
    save_world(tmp_path, save_ranks)
    results = load_world(tmp_path, load_ranks)
    check_loaded(results)
    r = results[0][2]
    assert r.iteration == 1 and r.kind == "mf" and r.optimizer_loaded and r.unused == []
    assert r.common["step"] == 1
    rng_state = r.common["rng"]
    assert isinstance(rng_state, tuple) and rng_state[1].dtype == np.uint32
    np.random.RandomState().set_state(rng_state)  # a usable numpy RNG state again
    assert r.per_rank == ({"rank": 0} if save_ranks == load_ranks else None)


def test_padding_is_left_untouched_on_load(tmp_path):
    save_world(tmp_path, 2)
    results = load_world(tmp_path, 4, layout={**LAYOUT_B, "moe.experts.w1": ("pad", 0)}, fill=-7)
    last = results[3][0]["moe.experts.w1"]  # 5 experts over 4 ranks: 2 per rank, rank 3 is all padding
    assert last.chunk_shape == (0, 3, 4) and (last.data == -7).all()
    assert (results[2][0]["moe.experts.w1"].data[1] == -7).all()


def test_files_and_metadata_follow_the_format(tmp_path):
    save_world(tmp_path, 2, iteration=100, prefix="qwen3")
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "100\n"
    it = tmp_path / "iteration_00000100"
    names = sorted(p.name for p in it.iterdir())
    assert names == ["common.json", "metadata.json", "qwen3-model-0000000-0000002.safetensors",
                     "qwen3-model-0000001-0000002.safetensors", "qwen3-opt-0000000-0000002.safetensors",
                     "qwen3-opt-0000001-0000002.safetensors"]
    meta = json.loads((it / "metadata.json").read_text())
    assert meta["world_size"] == 2 and meta["files"] == names[2:]
    emb = meta["model"]["tok_embeddings.weight"]
    assert emb["dtype"] == "F32" and emb["shape"] == [13, 8]
    assert [(c["offset"], c["shape"]) for c in emb["chunks"]] == [([0, 0], [7, 8]), ([7, 0], [6, 8])]
    assert meta["model"]["bf"]["dtype"] == "BF16" and meta["model"]["half"]["dtype"] == "F16"
    with safe_open(str(it / emb["chunks"][1]["file"]), "np") as f:  # files are plain safetensors
        np.testing.assert_array_equal(f.get_tensor("tok_embeddings.weight"), GLOBAL["tok_embeddings.weight"][7:])
    common = json.loads((it / "common.json").read_text())
    assert common["iteration"] == 100 and common["world_size"] == 2 and common["common"]["step"] == 100
    assert set(common["versions"]) == {"mf-ckpt", "numpy", "safetensors"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


def keys_per_file(directory: Path) -> dict[str, list[str]]:
    out = {}
    for f in sorted(directory.glob("*.safetensors")):
        with safe_open(str(f), "np") as h:
            out[f.name] = sorted(h.keys())
    return out


def test_remove_redundancy_writes_each_replicated_chunk_once_spread_evenly(tmp_path):
    glob = {f"w{i}": np.full((16, 16), i, np.float32) for i in range(8)}

    def body(comm, remove):
        st = {k: replicated(v, replica_id=comm.rank) for k, v in glob.items()}
        return save(SaveOptions(save_path=str(tmp_path / str(remove)), remove_redundancy=remove), 1, st, comm=comm)

    run_threaded(4, lambda c: body(c, True))
    files = keys_per_file(tmp_path / "True" / "iteration_00000001")
    assert sorted(k for ks in files.values() for k in ks) == sorted(glob)  # exactly once
    assert sorted(len(ks) for ks in files.values()) == [2, 2, 2, 2]  # spread evenly
    run_threaded(4, lambda c: body(c, False))
    files = keys_per_file(tmp_path / "False" / "iteration_00000001")
    assert all(ks == sorted(glob) for ks in files.values()) and len(files) == 4  # every rank its copy
    for remove in (True, False):
        out = {k: np.zeros_like(v) for k, v in glob.items()}
        load(str(tmp_path / str(remove)), out)
        assert all(np.array_equal(out[k], glob[k]) for k in glob)


def test_no_save_optim_and_no_load_optim(tmp_path):
    save_world(tmp_path, 2, no_save_optim=True)
    assert not list((tmp_path / "iteration_00000001").glob("*-opt-*"))
    with pytest.raises(CheckpointError, match="no optimizer state .* set no_load_optim"):
        load_world(tmp_path, 2)
    results = load_world(tmp_path, 2, fill=5, no_load_optim=True)
    check_loaded(results, optim=False)
    assert not results[0][2].optimizer_loaded
    assert all((st.data == 5).all() for r in results for st in r[1].values())  # optimizer untouched


def test_committed_checkpoint_is_what_the_marker_names(tmp_path):
    assert mf_ckpt.committed_checkpoint(tmp_path) is None                  # nothing saved yet
    save(str(tmp_path), 3, {"w": np.ones(2, np.float32)})
    (tmp_path / ".iteration_00000004.abc.incomplete").mkdir()             # a save cut short
    assert mf_ckpt.committed_checkpoint(tmp_path) == tmp_path / "iteration_00000003"
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("not a number")
    with pytest.raises(CheckpointError, match="does not hold an iteration number"):
        mf_ckpt.committed_checkpoint(tmp_path)


def test_layout_cache_skips_the_gather_while_structure_is_unchanged(tmp_path):
    def body(comm):
        saver = Saver(SaveOptions(save_path=str(tmp_path), save_max=None), comm)
        out = []
        st = state(GLOBAL, LAYOUT_A, comm.rank, 3)
        out.append(saver.save(1, st))
        st["norm.weight"].data += 1  # values change, structure does not
        out.append(saver.save(2, st))
        st["extra"] = replicated(np.ones(3, np.float32))  # structure changes on every rank
        out.append(saver.save(3, st))
        out.append(saver.save(4, st))
        return [r.layout_cache_hit for r in out]

    assert run_threaded(3, body) == [[False, True, False, True]] * 3
    meta = [json.loads((tmp_path / f"iteration_0000000{i}" / "metadata.json").read_text()) for i in (1, 2, 3)]
    sums = [m.pop("checksums") for m in meta]
    assert meta[0] == meta[1] and "extra" in meta[2]["model"]
    # the layout is the same, the checksums follow the data: only norm.weight's changed
    changed = {n for n in sums[0]["model"] if sums[0]["model"][n] != sums[1]["model"][n]}
    assert changed == {"norm.weight"}
    out = {"norm.weight": np.zeros(8, np.float32)}
    load(LoadOptions(load_path=str(tmp_path)), out, iteration=2)
    np.testing.assert_array_equal(out["norm.weight"], GLOBAL["norm.weight"] + 1)


def test_layout_cache_change_on_one_rank_redoes_the_save_everywhere(tmp_path):
    # Synchronous saves write by the cached plan without asking; the commit finds rank 2's new
    # structure, every rank drops the staged files, and the save is redone through the full exchange.
    def body(comm):
        saver = Saver(SaveOptions(save_path=str(tmp_path), save_max=None), comm)
        st = state(GLOBAL, LAYOUT_A, comm.rank, 3)
        hits = [saver.save(1, st).layout_cache_hit]
        if comm.rank == 2:
            st["norm.weight"] = ShardedTensor(st["norm.weight"].data, (8,), (0,), replica_id=7)
        hits.append(saver.save(2, st).layout_cache_hit)
        hits.append(saver.save(3, st).layout_cache_hit)
        return hits

    assert run_threaded(3, body) == [[False, False, True]] * 3
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "iteration_00000001", "iteration_00000002", "iteration_00000003", "latest_checkpointed_iteration.txt"]
    out = {"norm.weight": np.zeros(8, np.float32)}
    load(LoadOptions(load_path=str(tmp_path)), out, iteration=3)
    np.testing.assert_array_equal(out["norm.weight"], GLOBAL["norm.weight"])


def test_layout_cache_save_errors_and_disagreements_reach_every_rank(tmp_path):
    def body(comm):
        saver = Saver(SaveOptions(save_path=str(tmp_path), save_max=None), comm)
        st = state(GLOBAL, LAYOUT_A, comm.rank, 2)
        saver.save(1, st)
        with pytest.raises(CheckpointError, match=r"ranks disagree on the iteration to save: \[2, 3\]"):
            saver.save(2 + comm.rank, st)
        bad = dict(st, extra=np.ones(2, np.complex64)) if comm.rank == 1 else st
        # rank 1's structure changed (a new tensor): the redo's full exchange finds it unsavable
        with pytest.raises(CheckpointError, match="rank 1: model tensor 'extra': dtype complex64"):
            saver.save(4, bad)
        assert not saver.save(5, st).layout_cache_hit          # the cache is rebuilt ...
        with pytest.raises(CheckpointError, match=r"failed on rank 0: iteration must be an integer in \[0, 999999999999999999\]"):
            saver.save(6 if comm.rank else -1, st)            # ... and a cached save's error reaches all

    run_threaded(2, body)
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "5\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "iteration_00000001", "iteration_00000005", "latest_checkpointed_iteration.txt"]


def test_layout_cache_off_and_inconsistent_ranks(tmp_path):
    def body(comm):
        saver = Saver(SaveOptions(save_path=str(tmp_path), save_global_layout_cache=False), comm)
        st = state(GLOBAL, LAYOUT_A, comm.rank, 2)
        hits = [saver.save(1, st).layout_cache_hit, saver.save(2, st).layout_cache_hit]
        if comm.rank == 1:  # rank 1 alone claims a different global shape
            st["norm.weight"] = replicated(np.zeros(9, np.float32))
        with pytest.raises(CheckpointError, match=r"'norm.weight': rank 1 has F32\[9\], another rank F32\[8\]"):
            saver.save(3, st)
        return hits

    assert run_threaded(2, body) == [[False, False]] * 2
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "2\n"


def test_holes_and_overlaps_are_refused_at_save(tmp_path):
    def body(comm, offsets):
        st = {"w": ShardedTensor(np.ones((2, 4), np.float32), (4, 4), offsets[comm.rank])}
        save(str(tmp_path), 1, st, comm=comm)

    with pytest.raises(CheckpointError, match="'w' is not fully covered by its chunks"):
        run_threaded(2, lambda c: body(c, [(0, 0), (0, 0)]))
    with pytest.raises(CheckpointError, match="'w' has overlapping chunks"):
        run_threaded(2, lambda c: body(c, [(0, 0), (1, 0)]))
    assert not (tmp_path / "latest_checkpointed_iteration.txt").exists()


def test_load_reads_only_the_needed_byte_ranges(tmp_path, monkeypatch):
    big = {"w": np.arange(64 * 32, dtype=np.float32).reshape(64, 32)}
    run_threaded(4, lambda c: save(str(tmp_path), 1, {"w": shard_array(big["w"], 0, c.rank, 4)}, comm=c))
    read = []
    real = os.preadv

    def counting(fd, buffers, offset):
        n = real(fd, buffers, offset)
        read.append(n)
        return n

    monkeypatch.setattr(os, "preadv", counting)
    # One destination row block that straddles two stored chunks: rows 14..21.
    dest = ShardedTensor(np.zeros((8, 32), np.float32), (64, 32), (14, 0))
    result = load(LoadOptions(load_path=str(tmp_path), verify_checksums=False), {"w": dest})
    assert sum(read) == 8 * 32 * 4 == result.bytes_read and result.regions_read == 2
    np.testing.assert_array_equal(dest.data, big["w"][14:22])
    # With checksums checked (the default), each chunk read in part is read whole once: the
    # checksum covers all of it.
    read.clear()
    dest.data[...] = 0
    result = load(str(tmp_path), {"w": dest})
    assert sum(read) == 2 * 16 * 32 * 4 and result.checksums_verified == 2
    np.testing.assert_array_equal(dest.data, big["w"][14:22])


def test_load_balanced_reads_each_chunk_once(tmp_path):
    save_world(tmp_path, 2)

    def body(comm, balanced):
        model = {k: replicated(np.zeros_like(v)) for k, v in GLOBAL.items()}
        r = load(LoadOptions(load_path=str(tmp_path), load_balanced=balanced, load_worker_number=2), model, comm=comm)
        return model, r

    balanced = run_threaded(4, lambda c: body(c, True))
    plain = run_threaded(4, lambda c: body(c, False))
    meta = json.loads((tmp_path / "iteration_00000001" / "metadata.json").read_text())
    chunks = sum(len(t["chunks"]) for t in meta["model"].values())
    total = sum(v.nbytes for v in GLOBAL.values())
    assert sum(r[1].regions_read for r in balanced) == chunks and sum(r[1].bytes_read for r in balanced) == total
    assert sum(r[1].regions_read for r in plain) == 4 * chunks
    for model, _ in balanced:
        assert all(model[k].data.tobytes() == v.tobytes() for k, v in GLOBAL.items())
    reads = [r[1].bytes_read for r in balanced]
    assert max(reads) < total  # the reading is shared, not done by one rank


def test_floating_types_convert_on_load_others_refuse(tmp_path):
    save_world(tmp_path, 1, optim=False)
    out = {"tok_embeddings.weight": np.zeros((13, 8), np.float16), "bf": np.zeros((7, 2), np.float32)}
    load(str(tmp_path), out)
    np.testing.assert_array_equal(out["tok_embeddings.weight"], GLOBAL["tok_embeddings.weight"].astype(np.float16))
    np.testing.assert_array_equal(out["bf"], mf_ckpt.to_float32(GLOBAL["bf"]))
    with pytest.raises(CheckpointError, match="'counter' is I64, destination is F32"):
        load(str(tmp_path), {"counter": np.zeros((), np.float32)})


def test_strict_and_unused(tmp_path):
    save_world(tmp_path, 1, optim=False)
    with pytest.raises(CheckpointError, match="model tensor 'nope' not in the checkpoint"):
        load(str(tmp_path), {"nope": np.zeros(3)})
    out = {"nope": np.zeros(3), "norm.weight": np.zeros(8, np.float32)}
    r = load(str(tmp_path), out, strict=False)
    assert r.missing == ["nope"] and "tok_embeddings.weight" in r.unused and (out["nope"] == 0).all()


def test_enable_save_false_and_should_save(tmp_path):
    opts = SaveOptions(save_path=str(tmp_path / "x"), enable_save=False, save_interleaved_steps=10)
    assert Saver(opts).save(1, {"a": np.ones(2)}) is None and not (tmp_path / "x").exists()
    assert not opts.should_save(10)
    on = SaveOptions(save_path="p", save_interleaved_steps=10)
    assert [s for s in range(0, 35) if on.should_save(s)] == [10, 20, 30]


@pytest.mark.parametrize("kwargs,message", [
    ({"save_max": 0}, r"save_max: must be >= 1"),
    ({"save_interleaved_steps": 0}, r"save_interleaved_steps: must be >= 1"),
    ({"prefix": "a/b"}, r"prefix: must be a plain file name part"),
    ({"async_save": "yes"}, r"async_save: expected bool"),
])
def test_save_options_validation(kwargs, message):
    with pytest.raises(CheckpointError, match=message):
        SaveOptions(save_path="x", **kwargs)


def test_load_options_validation_and_empty_path():
    with pytest.raises(CheckpointError, match="load_worker_number: must be >= 1"):
        LoadOptions(load_path="x", load_worker_number=0)
    with pytest.raises(CheckpointError, match="load_path is empty"):
        load(LoadOptions(), {})
    with pytest.raises(CheckpointError, match="save_path: must be set"):
        Saver(SaveOptions())


def test_common_must_be_json_able(tmp_path):
    with pytest.raises(CheckpointError, match=r"common.bad: object cannot be stored"):
        save(str(tmp_path), 1, {"a": np.ones(2)}, common={"bad": object()})
