"""mf-ckpt against safetensors.numpy on the same bytes, side by side in one run.

    python benchmarks/ckpt_bench.py                  # 1 GiB state, 8 simulated ranks
    python benchmarks/ckpt_bench.py --size 128MiB    # quick run

Figures (issue 4 targets in brackets; ratio = reference time / our time, so > 1 is faster):
  save            8 ranks write their shards vs save_file of the whole state      [>= 0.8]
  save+fsync      the same with every file fsynced, as mf-ckpt does by default    (same bytes made durable)
  load            8 ranks load the layout they saved vs load_file                 [>= 0.8]
  load 8->3       3 ranks load the 8-rank checkpoint resharded vs load_file       [>= 0.6]
  ..., checksums off   the same loads without checking the chunks' CRC32C (on by default): the
                  difference is what the check costs (saves always compute them, as they write)
  layout cache    metadata phase of a 2nd save vs the 1st (ratio = 2nd / 1st)     [<= 0.05]
                  wall: slowest rank, waits included; cpu: the largest CPU time one rank spent in it
Each figure is the best of --repeat runs, ours and the reference alternating; dirty pages are
flushed (os.sync) before every timed run so no run pays for another's writeback; loads read
files hot in the page cache for both. The ranks are threads of one process: their Python work
shares one GIL (a collective with 8 threads costs several 5 ms GIL switch intervals), which real
multi-process ranks do not. Timings on a shared machine are noisy: compare the ratios.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from mf_ckpt import (
    LoadOptions,
    SaveOptions,
    Saver,
    ShardedTensor,
    load,
    run_threaded,
    shard_array,
    split_evenly,
    split_sizes,
)
from mf_ckpt.units import format_size, parse_size

MATRICES = ("attention.wq", "attention.wk", "attention.wv", "attention.wo",
            "feed_forward.w1", "feed_forward.w2", "feed_forward.w3")


def make_state(total_bytes: int, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A training checkpoint: (model, optimizer), the optimizer holding Adam's two moments.

    16 layers of seven [R, 1024] float32 matrices and two norms, R sized so that model and
    optimizer together make `total_bytes` (at 1 GiB: a ~90M-parameter model trained with Adam in
    fp32): 432 tensors, as a real checkpoint has hundreds.
    """
    rng = np.random.default_rng(seed)
    layers, cols = 16, 1024
    rows = max(8, total_bytes // (3 * layers * len(MATRICES) * cols * 4))
    rows -= rows % 8
    model = {}
    for i in range(layers):
        for name in MATRICES:
            model[f"layers.{i}.{name}.weight"] = rng.standard_normal((rows, cols), dtype=np.float32)
        model[f"layers.{i}.attention_norm.weight"] = np.ones(cols, np.float32)
        model[f"layers.{i}.ffn_norm.weight"] = np.ones(cols, np.float32)
    optim = {}
    for moment in ("exp_avg", "exp_avg_sq"):
        for name, arr in model.items():
            optim[f"{moment}.{name}"] = np.abs(arr) if moment == "exp_avg_sq" else arr * 0.1
    return model, optim


def rank_state(glob: dict[str, np.ndarray], rank: int, world: int) -> dict[str, ShardedTensor]:
    # Matrices split along rows (FSDP-like), norms replicated: a view, no copy.
    return {k: shard_array(v, 0, rank, world) if v.ndim == 2 else ShardedTensor(v, v.shape, (0,), rank)
            for k, v in glob.items()}


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def bench(args) -> None:
    total = parse_size(args.size)
    model, optim = make_state(total)
    glob = {**model, **optim}  # the reference writes and reads these same bytes as one file
    nbytes = sum(v.nbytes for v in glob.values())
    work = Path(tempfile.mkdtemp(prefix="ckpt_bench.", dir=args.dir))
    print(f"state: {len(glob)} tensors, {format_size(nbytes)}, {args.ranks} simulated ranks, dir {work}")
    ref_file = work / "reference.safetensors"
    best: dict[str, tuple[float, float]] = {}

    def record(name: str, ours: float, ref: float) -> None:
        o, r = best.get(name, (float("inf"), float("inf")))
        best[name] = (min(o, ours), min(r, ref))

    meta = {"wall": [float("inf"), float("inf")], "cpu": [float("inf"), float("inf")]}
    try:
        for rep in range(args.repeat):
            for fsync in (False, True):
                path = work / f"ours_{rep}_{fsync}"

                def ours_save(path=path, fsync=fsync):
                    def body(comm):
                        saver = Saver(SaveOptions(save_path=str(path), save_max=None, fsync=fsync), comm)
                        m, o = (rank_state(s, comm.rank, comm.world_size) for s in (model, optim))
                        comm.barrier()  # ranks start together: metadata time is the collective's, not skew
                        first = saver.save(1, m, o)
                        return saver, first

                    return run_threaded(args.ranks, body)

                os.sync()
                t_ours, savers = timed(ours_save)
                if not fsync:
                    # Layout cache: a second save with the same Saver objects (structure unchanged).
                    def second(comm, savers=savers):
                        m, o = (rank_state(s, comm.rank, comm.world_size) for s in (model, optim))
                        comm.barrier()
                        return savers[comm.rank][0].save(2, m, o)

                    os.sync()
                    seconds = run_threaded(args.ranks, second)
                    assert all(r.layout_cache_hit for r in seconds)
                    for kind, key, agg in (("wall", "metadata", max), ("cpu", "metadata_cpu", max)):
                        first = agg(s[1].timings[key] for s in savers)
                        again = agg(r.timings[key] for r in seconds)
                        meta[kind] = [min(meta[kind][0], first), min(meta[kind][1], again)]
                ref_file.unlink(missing_ok=True)

                def ref_save(fsync=fsync):
                    save_file(glob, str(ref_file))
                    if fsync:
                        fd = os.open(ref_file, os.O_RDONLY)
                        os.fsync(fd)
                        os.close(fd)

                os.sync()
                t_ref, _ = timed(ref_save)
                record("save+fsync" if fsync else "save", t_ours, t_ref)
                if fsync:
                    shutil.rmtree(path)
            ckpt = work / f"ours_{rep}_False"

            reshard = "load 8->3" if args.ranks == 8 else f"load {args.ranks}->3"
            for name, world, verify in (("load", args.ranks, True), (reshard, 3, True),
                                        ("load, checksums off", args.ranks, False),
                                        (f"{reshard}, checksums off", 3, False)):
                def ours_load(world=world, ckpt=ckpt, verify=verify):
                    def body(comm):
                        dest = [{}, {}]
                        for d, src in zip(dest, (model, optim)):
                            for k, v in src.items():
                                if v.ndim == 2:
                                    rows = split_sizes(v.shape[0], world)[comm.rank]
                                    local = np.empty((rows, v.shape[1]), v.dtype)
                                    d[k] = split_evenly(local, v.shape, 0, comm.rank, world)
                                else:
                                    d[k] = ShardedTensor(np.empty_like(v), v.shape, (0,), comm.rank)
                        load(LoadOptions(load_path=str(ckpt), load_worker_number=args.workers, verify_checksums=verify),
                             *dest, comm=comm)
                        return {**dest[0], **dest[1]}

                    return run_threaded(world, body)

                os.sync()
                t_ours, loaded = timed(ours_load)
                if rep == 0:  # correctness, outside the timing
                    for k in ("layers.0.attention.wq.weight", "exp_avg_sq.layers.15.feed_forward.w2.weight"):
                        assert np.array_equal(np.concatenate([d[k].data for d in loaded]), glob[k])
                del loaded
                os.sync()
                t_ref, ref = timed(lambda: load_file(str(ref_file)))
                del ref
                record(name, t_ours, t_ref)
            shutil.rmtree(ckpt)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    targets = {"save": 0.8, "save+fsync": None, "load": 0.8, "load, checksums off": None,
               f"{reshard}, checksums off": None}
    for name, (ours, ref) in best.items():
        target = targets.get(name, 0.6)
        note = f" (target >= {target})" if target else ""
        print(f"{name}: ours {ours:.3f} s, reference {ref:.3f} s, ratio {ref / ours:.2f}{note}")
    for kind, (first, again) in meta.items():
        print(f"layout cache ({kind}): ours {again * 1e3:.2f} ms, reference {first * 1e3:.2f} ms, "
              f"ratio {again / first:.3f} (second save's metadata time / first save's; target <= 0.05)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1GiB", help="state size, e.g. 1GiB, 128MiB")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1, help="load_worker_number per rank")
    parser.add_argument("--dir", default=None, help="where to write (default: the system temp dir)")
    bench(parser.parse_args())


if __name__ == "__main__":
    main()
