"""mf-parallel pipeline schedules on 2 CPU ranks: step time against one process, and each rank's
measured idle time against the simulator's prediction for the costs measured in the same step.

    python benchmarks/pipeline_bench.py          # launches itself on 2 ranks with mf_parallel.launch

Model: mf-models' llama (d 128, 4 layers, seq 64, vocab 512, tied embeddings), 8 micro-batches of 2
sequences per step, PyNative (the executor's mode). The one-process reference runs the same
micro-batches in the launching process before the ranks start (alone on the machine, as a rank
waiting in a collective may keep a core busy). Medians of TIMED steps after WARMUP.

On CPU the ranks share two cores and MCCL's p2p is a blocking all-reduce (no overlap), so the
ratio shows the cost of pipelining here (recomputed forwards, rendezvous waits), not a speed-up.
The simulator is run twice: "async" (the textbook's overlapped p2p) and "rendezvous" (what MCCL
does): the measured idle time should follow the rendezvous figure.

Output lines: `name: ours X, reference Y, ratio Z`.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops

import mf_config
import mf_models
import mf_parallel as mp

MODEL = {"model_type": "llama", "vocab_size": 512, "hidden_size": 128, "intermediate_size": 384,
         "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
         "tie_word_embeddings": True}
M, BATCH, SEQ, VOCAB = 8, 2, 64, 512
WARMUP, TIMED = 1, 3
SCHEDULES = {"gpipe": ("gpipe", 1, {}), "1f1b": ("1f1b", 1, {}), "interleaved_1f1b": ("1f1b", 2, {}),
             "1f1b_dxdw": ("1f1b", 1, {"dxdw_split": True}), "zbv": ("zbv", 1, {})}
_LS = ops.LogSoftmax(-1)


def micro_batches():
    rng = np.random.default_rng(0)
    out = []
    for _ in range(M):
        ids = rng.integers(0, VOCAB, (BATCH, SEQ)).astype(np.int32)
        out.append({"input_ids": Tensor(ids), "labels": Tensor(np.roll(ids, -1, 1)),
                    "loss_mask": Tensor(np.ones((BATCH, SEQ), np.float32))})
    return out


def loss_fn(logits, mb):
    per_token = -ops.gather_elements(_LS(logits.reshape(-1, VOCAB)), 1, mb["labels"].reshape(-1, 1)).reshape(-1)
    return (per_token * mb["loss_mask"].reshape(-1)).sum() / (M * BATCH * SEQ)


def one_process_step(model, mbs) -> float:
    params = model.trainable_params()
    t0 = time.perf_counter()
    for mb in mbs:
        out, vjp_fn = ms.vjp(lambda mb=mb: loss_fn(model(mb["input_ids"]), mb), weights=params)
        vjp_fn(ops.ones_like(out))
    return time.perf_counter() - t0


def worker() -> None:
    ms.set_context(mode=ms.PYNATIVE_MODE, pynative_synchronize=True)
    mesh = mp.init_mesh(mp.ParallelDims(2, pp=2))
    rank = mesh.rank
    mbs = micro_batches()
    for name, (schedule, interleave, flags) in SCHEDULES.items():
        spec = mp.resolve_pipeline(2, schedule, interleave, **flags)
        layout = mp.StageLayout.build(spec, mf_config.pipeline_layer_placement(
            None, 2, interleave, MODEL["num_hidden_layers"], schedule=spec.schedule))
        plan = mp.build_schedule(spec, M)
        stage = mf_models.pipeline_stage(mf_models.build_model(MODEL, seed=0), layout, rank)
        executor = mp.PipelineExecutor(plan, stage.chunks, mesh["pp"], tied=stage.tied, tied_ranks=layout.tied_ranks)
        steps = []
        for i in range(WARMUP + TIMED):
            mp.barrier(mesh["world"])
            t0 = time.perf_counter()
            result = executor.step(mbs, loss_fn)
            if i >= WARMUP:
                steps.append((time.perf_counter() - t0, result))
        seconds, result = sorted(steps, key=lambda s: s[0])[len(steps) // 2]
        table = np.zeros((plan.pp * plan.chunks, 3), np.float32)
        for stage, c in result.stage_costs().items():
            table[stage] = (c.F, c.B, c.W)
        table = mp.all_reduce(Tensor(table), mesh["world"]).asnumpy()     # every stage's measured costs
        costs = {v: mp.Costs(*(float(max(x, 1e-9)) for x in row)) for v, row in enumerate(table)}
        sim = {mode: mp.simulate_schedule(plan, p2p=mode, stage_costs=costs).ranks[rank]
               for mode in ("async", "rendezvous")}
        print("BENCH " + json.dumps({"name": name, "rank": rank, "seconds": seconds, "idle": result.idle_seconds,
                                     "span": result.span_seconds, "sim_idle": {k: float(v.idle) for k, v in sim.items()},
                                     "recomputed": M * plan.chunks - len(executor.keep_tape)}), flush=True)


def reference_step_time() -> float:
    """One process, no peers (a rank waiting in a collective may spin a core): median step time."""
    ms.set_context(mode=ms.PYNATIVE_MODE, pynative_synchronize=True)
    model, mbs = mf_models.build_model(MODEL, seed=0), micro_batches()
    times = [one_process_step(model, mbs) for _ in range(WARMUP + TIMED)][WARMUP:]
    return statistics.median(times)


def main() -> int:
    ref = reference_step_time()
    with tempfile.TemporaryDirectory() as tmp:
        quiet = open(os.devnull, "w")
        rc = mp.launch(2, [__file__], Path(tmp) / "logs", env={**os.environ, "MF_BENCH_WORKER": "1"},
                       console=quiet, cwd=tmp)
        logs = [(Path(tmp) / "logs" / f"worker_{r}.log").read_text(errors="replace") for r in range(2)]
    if rc != 0:
        print(logs[0][-3000:], logs[1][-3000:])
        return rc
    results = [json.loads(line.split("BENCH ", 1)[1]) for log in logs for line in log.splitlines() if "BENCH " in line]
    for name in SCHEDULES:
        rows = sorted((r for r in results if r["name"] == name), key=lambda r: r["rank"])
        step = max(r["seconds"] for r in rows)
        print(f"pipeline {name} step time (2 ranks, {M} micro-batches): ours {step:.3f} s, reference {ref:.3f} s "
              f"(1 process), ratio {step / ref:.2f}")
        for r in rows:
            for mode in ("rendezvous", "async"):
                want = r["sim_idle"][mode]
                ratio = r["idle"] / want if want > 1e-6 else float("nan")
                print(f"pipeline {name} rank {r['rank']} idle: ours {r['idle']:.3f} s, reference {want:.3f} s "
                      f"(simulated, {mode} p2p), ratio {ratio:.2f}")
    print("(a shared 2-core machine under load: noisy; forwards recomputed per step by the executor: "
          + ", ".join(f"{r['name']} rank {r['rank']} {r['recomputed']}" for r in results if "recomputed" in r) + ")")
    return 0


if __name__ == "__main__":
    if os.environ.get("MF_BENCH_WORKER"):
        worker()
    else:
        sys.exit(main())
