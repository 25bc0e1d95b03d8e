"""Loss parity: N training steps of the tiny model under a parallel layout give the per-step losses,
gradient norms and final (gathered) weights of one process training on the same global batch.

Usage: _parity_worker.py CASE [CASE ...]; the cases of one world size share one launch. The
reference runs on rank 0 only, in this same process, and touches nothing of mf-parallel: the plain
model, MindSpore's own sparse cross entropy, an independently written global-norm clip, full
batches. The parallel losses are global and the gathered weights are the same on every rank, so
rank 0 alone compares and reports.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import mindspore as ms
import numpy as np
from _results import emit
from _tiny_model import ParallelLoss, ReferenceClip, ReferenceLoss, TinyArgs, TrainStep, batches, build, parallelize
from mindspore import Tensor

import mf_parallel as mp

ARGS = TinyArgs()
STEPS = 8
GLOBAL_BATCH = 4
SEED = 3
MAX_NORM = 1.0
RTOL = 1e-5

# name -> (ParallelDims keywords, reshard policy, average gradients over dp, mode)
CASES = {
    "fsdp2": (dict(dp_shard=2), "always", False, "pynative"),
    "fsdp2_graph": (dict(dp_shard=2), "default", True, "graph"),
    "tp2": (dict(tp=2), "default", False, "pynative"),
    "tp2_graph": (dict(tp=2), "default", False, "graph"),
    "hsdp2x2": (dict(dp_replicate=2, dp_shard=2), "never", False, "pynative"),
    "fsdp2_tp2": (dict(dp_shard=2, tp=2), "default", False, "pynative"),
}

_REFERENCE: dict = {}


def reference(steps: int = STEPS, start: dict | None = None):
    """Losses, norms and final weights of the one-process run (cached per start state)."""
    key = (steps, None if start is None else id(start))
    if key in _REFERENCE:
        return _REFERENCE[key]
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)   # compiled once: the cheapest way through 8 steps
    model = build(ARGS, SEED)
    if start is not None:
        for name, p in model.parameters_and_names():
            p.set_data(Tensor(start[name]))
    step = TrainStep(ReferenceLoss(model), ReferenceClip(MAX_NORM))
    losses, norms = [], []
    data = batches(ARGS, STEPS + 2, GLOBAL_BATCH)
    chosen = data[:steps] if start is None else data[STEPS:STEPS + steps]
    for ids, labels, mask in chosen:
        loss, norm = step(Tensor(ids), Tensor(labels), Tensor(mask), Tensor(np.float32(mask.sum())))
        losses.append(float(loss.asnumpy()))
        norms.append(float(norm.asnumpy()))
    weights = {name: p.asnumpy().copy() for name, p in model.parameters_and_names()}
    ms.set_context(mode=previous)        # the other ranks keep running the parallel steps eagerly
    _REFERENCE[key] = (losses, norms, weights)
    return _REFERENCE[key]


def train_parallel(model, mesh, divide: bool, data):
    """Run the parallel model over `data`; returns (global losses, global norms, comm snapshot of step 1)."""
    dims = mesh.dims
    params = model.trainable_params()
    step = TrainStep(ParallelLoss(model, mesh["tp"]), mp.GlobalNormClip(model, params, mesh, MAX_NORM))
    dp_rank = dims.dp_rank(mesh.rank)
    rows = GLOBAL_BATCH // dims.dp
    losses, norms, comm = [], [], {}
    for i, (ids, labels, mask) in enumerate(data):
        sl = slice(dp_rank * rows, (dp_rank + 1) * rows)
        denom = mask.sum() / (dims.dp if divide else 1)
        mp.comm_stats().reset()
        loss, norm = step(Tensor(ids[sl]), Tensor(labels[sl]), Tensor(mask[sl]), Tensor(np.float32(denom)))
        loss.asnumpy()
        if i == 1:
            comm = mp.comm_stats().snapshot()
        total = mp.all_reduce(loss.reshape((1,)), mesh["dp"]).asnumpy()[0] / (dims.dp if divide else 1)
        losses.append(float(total))
        norms.append(float(norm.asnumpy()))
    return losses, norms, comm


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-12)))


def _weights_match(full: dict, ref: dict) -> tuple[bool, str]:
    if set(full) != set(ref):
        return False, f"parameter names differ: {sorted(set(full) ^ set(ref))}"
    worst = max(((name, float(np.max(np.abs(full[name] - ref[name])))) for name in ref), key=lambda t: t[1])
    ok = all(np.allclose(full[name], ref[name], rtol=RTOL, atol=1e-6) for name in ref)
    return ok, f"largest weight difference {worst[1]:.2e} ({worst[0]})"


def run_case(name: str):
    kwargs, policy, divide, mode = CASES[name]
    dims = mp.ParallelDims(mesh_world(), **kwargs)
    mesh = mp.init_mesh(dims)
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    start = time.monotonic()
    model = parallelize(build(ARGS, SEED), ARGS, mesh, policy, divide)
    losses, norms, comm = train_parallel(model, mesh, divide, batches(ARGS, STEPS + 2, GLOBAL_BATCH)[:STEPS])
    seconds = time.monotonic() - start
    ms.set_context(mode=ms.PYNATIVE_MODE)
    full = mp.gather_full_state(model, mesh)
    if mesh.rank != 0:
        return model, mesh, full
    ref_losses, ref_norms, ref_weights = reference()
    w_ok, w_detail = _weights_match(full, ref_weights)
    loss_err, norm_err = _rel(losses, ref_losses), _rel(norms, ref_norms)
    clipped = sum(n > MAX_NORM for n in ref_norms)
    ok = loss_err <= RTOL and norm_err <= RTOL and w_ok and clipped > 0
    detail = (f"{dims.describe()} policy={policy} divide={divide} mode={mode}: loss rel err {loss_err:.2e}, "
              f"grad-norm rel err {norm_err:.2e}, {clipped}/{STEPS} steps clipped, {w_detail}; {seconds:.1f}s")
    emit(f"parity[{name}]", ok, detail, losses=losses, reference=ref_losses, comm=comm)
    return model, mesh, full


def check_layout_tiles(model, mesh):
    """Replica-0 blocks of every rank cover each global tensor exactly once (what a sharded save writes)."""
    meta = mp.shard_metadata(model, mesh)
    every = mp.Communicator().all_gather_object(meta)
    for name in meta:
        shape = tuple(meta[name]["global_shape"])
        cover = np.zeros(shape, np.int32)
        for rank_meta in every:
            m = rank_meta[name]
            if m["replica_id"] == 0 and all(s > 0 for s in m["shape"]):
                cover[tuple(slice(o, o + s) for o, s in zip(m["offset"], m["shape"]))] += 1
        if not np.all(cover == 1):
            return False, f"{name}: replica-0 blocks cover elements {np.unique(cover).tolist()} times"
    return True, f"{len(meta)} parameters tile exactly"


def check_reload(name: str, full: dict):
    """Load full weights into a freshly parallelized model (reshard 1 -> layout) and train on:
    same losses as the one-process run continuing from the same weights."""
    kwargs, policy, divide, mode = CASES[name]
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    mesh = mp.init_mesh(mp.ParallelDims(mesh_world(), **kwargs))
    model = parallelize(build(ARGS, SEED + 1), ARGS, mesh, policy, divide)    # different init, then load
    mp.load_full_state(model, mesh, full)
    losses, _, _ = train_parallel(model, mesh, divide, batches(ARGS, STEPS + 2, GLOBAL_BATCH)[STEPS:])
    if mesh.rank != 0:
        return None
    ref_losses, _, _ = reference(2, start=full)
    err = _rel(losses, ref_losses)
    return err <= RTOL, f"continued losses {losses} vs {ref_losses}: rel err {err:.2e}"


def check_ckpt_roundtrip(model, mesh, full: dict):
    """mf-ckpt's sharded save through `Communicator` under FSDP2 x TP2 (each rank writes its real
    blocks, replicas once); one process loads the whole tensors; a fresh parallel model loads its
    blocks back (balanced: pieces read once and shared through all_gather_object)."""
    import mf_ckpt

    comm = mp.Communicator()
    path = str(Path.cwd() / "ckpt")         # the launch's working directory, shared by the ranks
    layouts = mp.param_layouts(model, mesh)
    state = {name: mf_ckpt.ShardedTensor(layouts[name].to_block(p.asnumpy()), layouts[name].global_shape,
                                         layouts[name].offset, layouts[name].replica_id)
             for name, p in model.parameters_and_names()}
    mf_ckpt.save(mf_ckpt.SaveOptions(save_path=path, remove_redundancy=True), STEPS, state, comm=comm)
    single_ok = True
    if mesh.rank == 0:
        whole = {name: np.zeros(lay.global_shape, np.float32) for name, lay in layouts.items()}
        mf_ckpt.load(path, whole, comm=mf_ckpt.SingleProcess())
        single_ok = all(np.array_equal(whole[name], full[name]) for name in full)
    comm.barrier()
    kwargs, policy, divide, _ = CASES["fsdp2_tp2"]
    fresh = parallelize(build(ARGS, SEED + 2), ARGS, mesh, policy, divide)
    lays = mp.param_layouts(fresh, mesh)
    targets = {name: mf_ckpt.ShardedTensor(np.zeros(lay.shape, np.float32), lay.global_shape, lay.offset,
                                           lay.replica_id) for name, lay in lays.items()}
    mf_ckpt.load(mf_ckpt.LoadOptions(load_path=path, load_balanced=True), targets, comm=comm)
    mp.load_sharded_state(fresh, mesh, lambda name, offset, shape: targets[name].data)
    back = mp.gather_full_state(fresh, mesh)
    back_ok = all(np.array_equal(back[name], full[name]) for name in full)
    return single_ok and back_ok, f"one-process load exact: {single_ok}; reloaded into FSDP2 x TP2 exact: {back_ok}"


def _on_rank0(name: str, fn, *args) -> None:
    """Run a collective check on every rank; rank 0 reports it."""
    try:
        result = fn(*args)
    except Exception as exc:  # reported, then the next check runs
        import traceback

        result = (False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-2000:]}")
    if mp.init_distributed()[0] == 0:
        emit(name, *result)


def mesh_world() -> int:
    return mp.init_distributed()[1]


def main(names):
    for name in names:
        try:
            model, mesh, full = run_case(name)
        except Exception as exc:  # report and continue with the next case
            import traceback

            emit(f"parity[{name}]", False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-3000:]}")
            continue
        if name == "fsdp2_tp2":
            _on_rank0(f"layout_tiles[{name}]", check_layout_tiles, model, mesh)
            _on_rank0(f"reload[{name}]", check_reload, name, full)
            _on_rank0(f"ckpt_roundtrip[{name}]", check_ckpt_roundtrip, model, mesh, full)
            # Two parallel axes: on CPU this layout must run eagerly (backend.graph_mode_blocker).
            reason = mp.graph_mode_blocker(mesh.dims)
            if mesh.rank == 0:
                emit(f"graph_mode_blocked[{name}]", reason is not None and "PyNative" in reason, str(reason))


if __name__ == "__main__":
    main(sys.argv[1:])
    emit("done", True)
