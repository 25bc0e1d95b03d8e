"""mf-parallel: communication volume per step against the analytic count, and step time on 2 CPU
ranks against one process.

    python benchmarks/parallel_bench.py          # launches itself on 2, then 4 ranks (mf_parallel.launch)

For each strategy the counter's bytes per collective kind in one training step (forward, backward,
global-norm clip) must equal the count derived here from the architecture alone (shapes, batch,
the strategy's rules); a mismatch exits non-zero. Step times are medians of compiled (GRAPH_MODE)
steps, or of PyNative steps for layouts with two parallel axes (which CPU ranks cannot compile:
`mf_parallel.graph_mode_blocker`; compared with one process in PyNative too), measured in the same
run as the one-process reference; the machine is shared, so they are
noisy, and on CPU every "parallel" rank competes for the same two cores: the ratio shows the cost
of the communication and the emulation, not a speed-up. Each rank runs its kernels on (cores this
process may use) // ranks threads (`mindspore.device_context.cpu.op_tuning.threads_num`; 1 each for
2 ranks on 2 cores; MF_BENCH_RANK_THREADS overrides), the one process on all of them.

Then, on the 2 ranks, the fixed cost of one collective call: a compiled chain of LATENCY_CHAIN
all-reduces over both ranks (each one's input is the last one's output, so none overlaps), of 4 B,
64 KiB and 1 MiB, against the same chain with the all-reduce replaced by a local multiply; per
call, (chain - local chain) / LATENCY_CHAIN. Each 2-rank strategy's line then says how much of its
excess over one rank's compute its calls and bytes explain at that price (a fixed cost per call
and a cost per MiB, fitted to the 4 B and 1 MiB chains); the rest is waiting.

Output lines: `name: ours X, reference Y, ratio Z`.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import mindspore as ms
import numpy as np
from _tiny_model import (
    ParallelLoss,
    TinyArgs,
    TrainStep,
    batches,
    build,
    parallelize,
)
from mindspore import Tensor

import mf_parallel as mp

ARGS = TinyArgs(vocab=512, dim=128, n_layers=2, n_heads=4, n_kv_heads=2, hidden=384, seq=64)
GLOBAL_BATCH = 8
WARMUP, TIMED = 3, 20
F32 = 4
# name -> (world size, ParallelDims keywords, reshard policy). On CPU a layout with two parallel
# axes runs PyNative (mf_parallel.graph_mode_blocker): it is compared with one process in PyNative.
STRATEGIES = {
    "fsdp2_always": (2, dict(dp_shard=2), "always"),
    "fsdp2_never": (2, dict(dp_shard=2), "never"),
    "tp2": (2, dict(tp=2), "default"),
    "hsdp2x2": (4, dict(dp_replicate=2, dp_shard=2), "default"),
    "fsdp2_tp2": (4, dict(dp_shard=2, tp=2), "default"),
}
TARGETS = {2: 1.5, 4: 2.5}
LATENCY_CHAIN = 20
LATENCY_SIZES = {"4 B": 1, "64 KiB": 16384, "1 MiB": 262144}   # float32 elements


# ----------------------------------------------------------------------------- analytic counts
COLWISE = ("wq", "wk", "wv", "w1", "w3")
ROWWISE = ("wo", "w2")


def _param_shapes(a: TinyArgs, tp: int = 1) -> dict[str, tuple[int, ...]]:
    """Every parameter's shape on one rank before FSDP: split by `tp_plan` (column-parallel and
    vocab-parallel along dim 0, row-parallel weights along dim 1; norms and row biases whole)."""
    hd = a.dim // a.n_heads
    shapes = {"tok_embeddings.embedding_table": (a.vocab // tp, a.dim), "norm.weight": (a.dim,),
              "output.weight": (a.vocab // tp, a.dim)}
    for i in range(a.n_layers):
        p = f"layers.{i}."
        shapes.update({
            p + "attention_norm.weight": (a.dim,), p + "ffn_norm.weight": (a.dim,),
            p + "attention.wq.weight": (a.n_heads * hd // tp, a.dim), p + "attention.wq.bias": (a.n_heads * hd // tp,),
            p + "attention.wk.weight": (a.n_kv_heads * hd // tp, a.dim),
            p + "attention.wv.weight": (a.n_kv_heads * hd // tp, a.dim),
            p + "attention.wo.weight": (a.dim, a.n_heads * hd // tp), p + "attention.wo.bias": (a.dim,),
            p + "feed_forward.w1.weight": (a.hidden // tp, a.dim), p + "feed_forward.w2.weight": (a.dim, a.hidden // tp),
            p + "feed_forward.w3.weight": (a.hidden // tp, a.dim),
        })
    return shapes


def _add(table, key, calls, payload, issued):
    entry = table.setdefault(key, {"calls": 0, "payload_bytes": 0, "issued_bytes": 0})
    entry["calls"] += calls
    entry["payload_bytes"] += payload
    entry["issued_bytes"] += issued


def _gather_key(group: int, world: int) -> tuple[str, int]:
    """(counter key, issued bytes per payload byte) of an all-gather on MCCL: native on the world
    group only, elsewhere emulated by an all-reduce of group-size slots."""
    return ("all_gather/native", 1) if group == world else ("all_gather/emulated", group)


def analytic_fsdp(table: dict, a: TinyArgs, dims: mp.ParallelDims, policy: str, bucketed: bool) -> None:
    """ZeRO-3 over the dp_shard ranks, on the TP-local shapes: gather every shard before use (again
    in backward when the unit reshards), reduce-scatter every padded fp32 gradient (MCCL: emulated
    as all_reduce + slice), and under HSDP all-reduce the scattered shard over the replicas.
    `bucketed` (PyNative, the Trainer's gather prefetch): the same bytes, one gather call per unit
    run: the root's embedding, each block, the root's head (norm + output), and in backward each
    resharded block (and the root's two runs when it reshards); and one reduce-scatter per unit (its
    bucket of every gradient, `enable_gradient_buckets`). The output weight is gathered once:
    the loss fused with the projection keeps nothing for its backward, so nothing is re-gathered.
    The replica all-reduces (HSDP) are left to the step: one call over every shard."""
    n = dims.dp_shard
    key, factor = _gather_key(n, dims.world_size)
    if bucketed:
        blocks = sum(mp.reshard_after_forward_for(policy, last=i == a.n_layers - 1) for i in range(a.n_layers))
        root = mp.reshard_after_forward_for(policy, last=True)
        _add(table, key, 2 + a.n_layers + blocks + 2 * root, 0, 0)
        _add(table, "reduce_scatter/emulated", a.n_layers + 1, 0, 0)      # the blocks and the root
    for name, shape in _param_shapes(a, dims.tp).items():
        rest = math.prod(shape[1:])
        chunk = math.ceil(shape[0] / n)
        shard, padded = chunk * rest * F32, n * chunk * rest * F32
        layer = name.split(".")[1] if name.startswith("layers.") else None
        last = layer is None or int(layer) == a.n_layers - 1
        reshard = mp.reshard_after_forward_for(policy, last=last)
        # A row-parallel bias under TP is added after the output's reduce-scatter (deferred): gathered
        # once, outside the recomputing backward, so never again in backward.
        deferred = dims.tp > 1 and name.endswith("wo.bias")
        gathers = 1 + (reshard and not deferred and name != "output.weight")
        _add(table, key, 0 if bucketed else gathers, gathers * shard, gathers * shard * factor)
        _add(table, "reduce_scatter/emulated", 0 if bucketed else 1, padded, padded)
        if dims.dp_replicate > 1:
            _add(table, "all_reduce/native", 0, shard, shard)
    if dims.dp_replicate > 1:
        _add(table, "all_reduce/native", 1, 0, 0)


def analytic_tp(table: dict, a: TinyArgs, dims: mp.ParallelDims, batch: int) -> None:
    """Megatron TP with sequence parallelism over the tp ranks. Per block: all-gather the sequence
    before attention and before the MLP, reduce-scatter after wo and w2 (each reversed in
    backward); embedding reduce-scatter and output all-gather likewise; the gradients of replicated
    norm weights and of wo's bias all-reduced by the step in ONE call (their FSDP shards under
    FSDP x TP); the loss fused with the vocab-parallel projection: per chunk of at most
    LINEAR_CE_CHUNK_BYTES of logits, one all-gather of two floats per token."""
    tp = dims.tp
    key, factor = _gather_key(tp, dims.world_size)
    full = batch * a.seq * a.dim * F32
    shard = full // tp
    gathers = 2 * a.n_layers + 1            # attention and MLP inputs, output projection input
    scatters = 2 * a.n_layers + 1           # wo and w2 outputs, embedding output
    moved = gathers + scatters
    _add(table, key, moved, moved * shard, moved * shard * factor)
    _add(table, "reduce_scatter/emulated", moved, moved * full, moved * full)
    synced = 3 * a.n_layers + 1             # attention_norm, ffn_norm, wo.bias per block; final norm
    held = math.ceil(a.dim / dims.dp_shard)       # each one's FSDP shard (the whole vector without FSDP)
    _add(table, "all_reduce/native", 1, synced * held * F32, synced * held * F32)
    tokens = batch * a.seq
    chunk_rows = max(1, mp.LINEAR_CE_CHUNK_BYTES // (F32 * a.vocab // tp))
    for start in range(0, tokens, chunk_rows):
        stats = 2 * min(chunk_rows, tokens - start) * F32
        _add(table, key, 1, stats, stats * factor)


def analytic(a: TinyArgs, dims: mp.ParallelDims, policy: str, batch: int, bucketed: bool) -> dict:
    """Bytes and calls per collective kind in one step of `dims`, from the architecture alone; plus
    the clip's scalar all-reduce over the world."""
    table: dict = {}
    if dims.tp > 1:
        analytic_tp(table, a, dims, batch)
    if dims.dp_shard > 1 or dims.dp_replicate > 1:
        analytic_fsdp(table, a, dims, policy, bucketed)
    _add(table, "all_reduce/native", 1, F32, F32)
    return table


# ----------------------------------------------------------------------------- timing
def _time_steps(step, data) -> float:
    times = []
    for i, (ids, labels, mask, denom) in enumerate(data[: WARMUP + TIMED]):
        start = time.perf_counter()
        loss, _ = step(ids, labels, mask, denom)
        loss.asnumpy()
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def _data(rows: slice):
    out = []
    for ids, labels, mask in batches(ARGS, WARMUP + TIMED, GLOBAL_BATCH):
        out.append((Tensor(ids[rows]), Tensor(labels[rows]), Tensor(mask[rows]), Tensor(np.float32(mask.sum()))))
    return out


def one_process_step() -> TrainStep:
    """The same step code on one process (a one-rank mesh: no plan, no collective): the fused loss,
    the global-norm clip, SGD; what the multi-rank steps are compared with."""
    mesh = mp.init_mesh(mp.ParallelDims(1))
    model = build(ARGS, 0)
    return TrainStep(ParallelLoss(model, mesh["tp"]), mp.GlobalNormClip(model, model.trainable_params(), mesh, 1.0))


def reference_step_time(mode: int) -> float:
    ms.set_context(mode=mode)
    if mode == ms.PYNATIVE_MODE:
        ms.set_context(pynative_synchronize=True)      # as the Trainer runs PyNative
    return _time_steps(one_process_step(), _data(slice(None)))


def _mode_of(world: int, kwargs: dict) -> int:
    blocked = mp.graph_mode_blocker(mp.ParallelDims(world, **kwargs), backend="mccl")
    return ms.PYNATIVE_MODE if blocked else ms.GRAPH_MODE


def rank_compute_alone() -> None:
    """What one rank's share costs without any communication: one process, a 2-rank data-parallel
    share of the global batch, the threads a rank gets (MF_BENCH_ALONE). Prints one BENCH line."""
    from mindspore.device_context.cpu import op_tuning

    op_tuning.threads_num(int(os.environ["MF_BENCH_ALONE"]))
    ms.set_context(mode=ms.GRAPH_MODE)
    seconds = _time_steps(one_process_step(), _data(slice(0, GLOBAL_BATCH // 2)))
    print("BENCH " + json.dumps({"alone": seconds}), flush=True)


def _alone_seconds(threads: int) -> float:
    import subprocess

    out = subprocess.run([sys.executable, __file__], env={**os.environ, "MF_BENCH_ALONE": str(threads)},
                         capture_output=True, text=True, check=True).stdout
    return next(json.loads(line.split("BENCH ", 1)[1]) for line in out.splitlines() if "BENCH " in line)["alone"]


def rank_threads(world: int) -> int:
    """Kernel threads per rank: the cores this process may use, shared out among the ranks (so 2
    ranks on 2 cores take 1 each and do not oversubscribe them); MF_BENCH_RANK_THREADS overrides."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return int(os.environ.get("MF_BENCH_RANK_THREADS", max(1, cores // world)))


def worker() -> None:
    from mindspore.device_context.cpu import op_tuning

    world = mp.init_distributed()[1]
    threads = rank_threads(world)
    op_tuning.threads_num(threads)
    for name, (size, kwargs, policy) in STRATEGIES.items():
        if size != world:
            continue
        mode = _mode_of(world, kwargs)
        ms.set_context(mode=mode)
        if mode == ms.PYNATIVE_MODE:
            ms.set_context(pynative_synchronize=True)
        dims = mp.ParallelDims(world, **kwargs)
        mesh = mp.init_mesh(dims)
        model = parallelize(build(ARGS, 0), ARGS, mesh, policy)
        # As the Trainer: the per-parameter gradient all-reduces left to the step (one per group),
        # then, in PyNative, FSDP gathers one unit run ahead, each run bucketed.
        deferred = mp.defer_gradient_syncs(model)
        bucketed = mp.gather_prefetch_pays_off(mode) and dims.dp_shard > 1
        buckets = None
        if bucketed:
            mp.enable_gather_prefetch(model)
            buckets = mp.enable_gradient_buckets(model)
        step = TrainStep(ParallelLoss(model, mesh["tp"]), mp.GlobalNormClip(model, model.trainable_params(), mesh, 1.0),
                         deferred=deferred, buckets=buckets)
        rows = GLOBAL_BATCH // dims.dp
        r = dims.dp_rank(mesh.rank)
        data = _data(slice(r * rows, (r + 1) * rows))
        seconds = _time_steps(step, data)
        mp.comm_stats().reset()
        loss, _ = step(*data[0])
        loss.asnumpy()
        print("BENCH " + json.dumps({"name": name, "seconds": seconds, "comm": mp.comm_stats().snapshot(),
                                     "dp": dims.dp, "world": world, "mode": mode, "threads": threads,
                                     "bucketed": bucketed}), flush=True)
    if world == 2:
        print("BENCH " + json.dumps({"latency": collective_latency()}), flush=True)


def collective_latency() -> dict[str, float]:
    """Seconds per all-reduce call over the world group, by payload (see the module doc)."""
    from mindspore import nn, ops

    ms.set_context(mode=ms.GRAPH_MODE)

    class Chain(nn.Cell):
        def __init__(self, reduce: bool):
            super().__init__()
            self.reduce = reduce
            self.all_reduce = ops.AllReduce()

        def construct(self, x):
            for _ in range(LATENCY_CHAIN):
                x = (self.all_reduce(x) if self.reduce else x * 2.0) * 0.5
            return x

    out = {}
    for label, n in LATENCY_SIZES.items():
        x = Tensor(np.ones(n, np.float32))
        seconds = {}
        for reduce in (True, False):
            chain = Chain(reduce)
            for _ in range(3):
                chain(x).asnumpy()
            times = []
            for _ in range(15):
                start = time.perf_counter()
                chain(x).asnumpy()
                times.append(time.perf_counter() - start)
            seconds[reduce] = statistics.median(times)
        out[label] = max(0.0, seconds[True] - seconds[False]) / LATENCY_CHAIN
    return out


def _latency_model(latency: dict[str, float]) -> tuple[float, float]:
    """(seconds a call, seconds a MiB) from the smallest and largest measured all-reduce."""
    small, large = LATENCY_SIZES["4 B"] * F32, LATENCY_SIZES["1 MiB"] * F32
    per_byte = max(0.0, latency["1 MiB"] - latency["4 B"]) / (large - small)
    return max(0.0, latency["4 B"] - small * per_byte), per_byte * 2**20


def _launch(world: int) -> tuple[int, list[dict], str]:
    with tempfile.TemporaryDirectory() as tmp:
        quiet = open(os.devnull, "w")
        rc = mp.launch(world, [__file__], Path(tmp) / "logs", env={**os.environ, "MF_BENCH_WORKER": "1"},
                       console=quiet, cwd=tmp)
        log = (Path(tmp) / "logs" / "worker_0.log").read_text(errors="replace")
    return rc, [json.loads(line.split("BENCH ", 1)[1]) for line in log.splitlines() if "BENCH " in line], log


MODE_NAMES = {ms.GRAPH_MODE: "GRAPH_MODE", ms.PYNATIVE_MODE: "PyNative"}


def main() -> int:
    load_before = os.getloadavg()[0]
    modes = sorted({_mode_of(world, kwargs) for world, kwargs, _ in STRATEGIES.values()})
    references = {mode: reference_step_time(mode) for mode in modes}
    results = []
    for world in sorted({world for world, _, _ in STRATEGIES.values()}):
        rc, found, log = _launch(world)
        if rc != 0:
            print(log[-3000:])
            return rc
        results += found
    latency = next((r["latency"] for r in results if "latency" in r), None)
    results = [r for r in results if "latency" not in r]
    alone = _alone_seconds(rank_threads(2)) if any(r["world"] == 2 for r in results) else None
    mismatches = 0
    for res in results:
        name, mode = res["name"], res["mode"]
        world, kwargs, policy = STRATEGIES[name]
        want = analytic(ARGS, mp.ParallelDims(world, **kwargs), policy, GLOBAL_BATCH // res["dp"], res["bucketed"])
        got = res["comm"]
        for key in sorted(set(want) | set(got)):
            for field in ("payload_bytes", "issued_bytes", "calls"):
                ours, ref = got.get(key, {}).get(field, 0), want.get(key, {}).get(field, 0)
                ratio = ours / ref if ref else float("nan")
                mismatches += ours != ref
                print(f"{name} {key} {field}/step: ours {ours}, reference {ref} (analytic), ratio {ratio:.3f}")
        ref_seconds = references[mode]
        calls = sum(v["calls"] for v in got.values())
        print(f"{name} step time ({world} ranks x {res['threads']} kernel thread(s), {MODE_NAMES[mode]}, {calls} "
              f"collective calls per step): ours {res['seconds'] * 1e3:.1f} ms, reference {ref_seconds * 1e3:.1f} ms "
              f"(1 process, same global batch and step code, {MODE_NAMES[mode]}), ratio "
              f"{res['seconds'] / ref_seconds:.2f} (target <= {TARGETS[world]})")
        if latency and alone and world == 2 and mode == ms.GRAPH_MODE:
            fixed, per_mib = _latency_model(latency)
            mib = sum(v["issued_bytes"] for v in got.values()) / 2**20
            cost = calls * fixed + mib * per_mib
            excess = res["seconds"] - alone
            print(f"{name} excess over one rank's compute: {excess * 1e3:.1f} ms; its {calls} calls and {mib:.2f} MiB "
                  f"issued at the measured cost ({fixed * 1e3:.2f} ms a call + {per_mib * 1e3:.2f} ms a MiB) account "
                  f"for {cost * 1e3:.1f} ms, the rest ({(excess - cost) * 1e3:.1f} ms) is waiting at the calls "
                  f"(each one a rendezvous of ranks sharing two cores)")
    if latency:
        print("collective latency (2 ranks, GRAPH_MODE, all-reduce over both, a compiled chain of "
              f"{LATENCY_CHAIN} minus the same chain local): " + ", ".join(f"{k} {v * 1e3:.2f} ms"
                                                                        for k, v in latency.items()) + " per call")
    two = [r for r in results if r["world"] == 2]
    if two and alone:
        threads = two[0]["threads"]
        ref_seconds = references[ms.GRAPH_MODE]
        print(f"rank compute alone (1 process, half the global batch, {threads} kernel thread(s), no communication): "
              f"{alone * 1e3:.1f} ms, reference {ref_seconds * 1e3:.1f} ms, ratio {alone / ref_seconds:.2f} "
              f"(for information: the floor of the 2-rank ratios above; the rest is collectives and waits)")
    print(f"(step times measured on a 2-core machine, possibly shared: noisy; load average {load_before:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after; {len(results)} strategies, {mismatches} byte-count mismatches)")
    return 1 if mismatches or len(results) != len(STRATEGIES) else 0


if __name__ == "__main__":
    if os.environ.get("MF_BENCH_ALONE"):
        rank_compute_alone()
    elif os.environ.get("MF_BENCH_WORKER"):
        worker()
    else:
        sys.exit(main())
