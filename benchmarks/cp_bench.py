"""mf-parallel context parallelism: peak memory and time of one training step at a long sequence,
per rank, with cp 1 (one process: the reference), 2 and 4 (ring attention, zigzag chunks).

    python benchmarks/cp_bench.py                    # seq 4096, cp 1 and 2
    python benchmarks/cp_bench.py --seq 8192 --cp 2 4 --method ulysses
    python benchmarks/cp_bench.py --seq 8192 --cp 4 --no-reference   # when one process would not fit

The tiny llama of mf-models (fp32, batch 1) runs forward and backward (`ms.value_and_grad`) in
PyNative. Memory on CPU ranks is the process's peak RSS over its training steps above the RSS of
the built model: the kernel's high-water mark is reset (`/proc/self/clear_refs` = 5) before the
first step, then `VmHWM - VmRSS before` is what the steps added (activations, gradients, scores,
and whatever MindSpore's allocator keeps of them). Full attention keeps [S, S] score and
probability matrices per head and layer; the ring keeps [S/cp, S/cp] blocks and saves only q, k,
v, output and row statistics, so the attention share should fall as 1/cp. Times are medians of
TIMED steps in the same run as the one-process reference; the machine is shared and every rank
competes for the same two cores, so the time ratio shows overhead, not a speed-up.

Output lines: `name: ours X, reference Y, ratio Z`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

WARMUP, TIMED = 1, 3


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def worker(seq: int, method: str) -> None:
    import mindspore as ms
    import numpy as np
    from mindspore import Tensor, ops

    import mf_models
    import mf_parallel as mp

    ms.set_context(mode=ms.PYNATIVE_MODE, pynative_synchronize=True)
    world = int(os.environ.get("MS_WORKER_NUM", "1"))
    section = mf_models.tiny_model_section("llama", max_position_embeddings=seq, seq_length=seq)
    model = mf_models.build_model(section, seed=0)
    rng = np.random.default_rng(0)
    text = rng.integers(2, 64, (1, seq + 1))
    batch = {"input_ids": text[:, :-1], "labels": text[:, 1:], "loss_mask": np.ones((1, seq), np.float32)}
    rank = 0
    if world > 1:
        mesh = mp.init_mesh(mp.ParallelDims(world, cp=world))
        rank = mesh.rank
        layout = mp.Layout.for_dims(mesh.dims, {"context_parallel_method": method})
        mf_models.parallelize_model(model, mesh, mf_models.ParallelOptions(layout))
        batch = mp.slice_for_context_parallel(batch, world, mesh.dims.coordinate("cp", rank))
    ids = Tensor(batch["input_ids"].astype(np.int32))
    labels = Tensor(batch["labels"].astype(np.int32))
    positions = Tensor(np.ascontiguousarray(batch.get("position_ids", np.arange(seq)[None]), np.int32))
    inv = 1.0 / seq

    def loss_fn(ids, positions, labels):
        logits = model(ids, positions)
        logp = ops.LogSoftmax(-1)(logits)
        return -ops.gather_elements(logp, -1, labels.expand_dims(-1)).sum() * inv

    step = ms.value_and_grad(loss_fn, None, model.trainable_params())
    times = []
    reset = _reset_peak()
    before = _status_kib("VmRSS")
    for i in range(WARMUP + TIMED):
        if world > 1:
            mp.barrier(mesh["world"])
        t0 = time.perf_counter()
        loss, grads = step(ids, positions, labels)
        float(loss.asnumpy())
        if i >= WARMUP:
            times.append(time.perf_counter() - t0)
        del grads
    added = (_status_kib("VmHWM") if reset else _status_kib("VmRSS")) - before
    print("CPBENCH " + json.dumps({"cp": world, "rank": rank, "seconds": statistics.median(times),
                                   "step_kib": added, "rss_kib": _status_kib("VmRSS"), "peak_reset": reset}),
          flush=True)


def _collect(text: str) -> list[dict]:
    return [json.loads(line.split("CPBENCH ", 1)[1]) for line in text.splitlines() if "CPBENCH " in line]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=4096, help="tokens per sequence (default 4096)")
    parser.add_argument("--cp", type=int, nargs="+", default=[2], help="context-parallel degrees (default 2)")
    parser.add_argument("--method", default="colossal", choices=("colossal", "ulysses"))
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the one-process run (its full [S, S] attention may not fit in memory): "
                             "per-rank figures only, no ratios")
    args = parser.parse_args()
    for cp in args.cp:
        if cp < 2 or args.seq % (2 * cp):
            parser.error(f"--cp: {cp} must be >= 2 and 2 x cp must divide --seq {args.seq}")
    import subprocess

    import mf_parallel as mp

    env = {k: v for k, v in os.environ.items() if k not in ("MS_WORKER_NUM", "RANK_SIZE", "WORLD_SIZE")}
    # The worker's settings travel in the environment: msrun would take "--worker" for its own option.
    worker_env = {"MF_CP_BENCH_WORKER": f"{args.seq},{args.method}"}
    worker_args = [os.path.abspath(__file__)]
    ref, peak_reset = None, True
    if not args.no_reference:
        proc = subprocess.run([sys.executable, *worker_args], capture_output=True, text=True,
                              env={**env, **worker_env, "GLOG_v": "3"}, timeout=3600)
        found = _collect(proc.stdout)
        if proc.returncode != 0 or not found:
            print(proc.stdout[-3000:], proc.stderr[-3000:])
            return 1
        ref = found[0]
        print(f"cp 1 (one process), seq {args.seq}: steps add {ref['step_kib'] / 1024:.0f} MiB, "
              f"{ref['seconds']:.2f} s per step", flush=True)
    for cp in args.cp:
        with tempfile.TemporaryDirectory() as tmp:
            quiet = open(os.devnull, "w")
            rc = mp.launch(cp, worker_args, Path(tmp) / "logs", env={**os.environ, **worker_env}, console=quiet,
                           cwd=tmp)
            logs = [p.read_text(errors="replace") if p.exists() else "" for p in
                    (Path(tmp) / "logs" / f"worker_{r}.log" for r in range(cp))]
        rows = [r for log in logs for r in _collect(log)]
        if rc != 0 or len(rows) != cp:
            print(*(log[-2000:] for log in logs))
            return rc or 1
        worst = max(r["step_kib"] for r in rows)
        slowest = max(r["seconds"] for r in rows)
        peak_reset = all(r["peak_reset"] for r in rows)
        if ref is None:
            print(f"cp {cp} {args.method} step memory per rank (worst rank, seq {args.seq}): {worst / 1024:.0f} MiB; "
                  f"step time {slowest:.2f} s (no one-process reference)", flush=True)
            continue
        print(f"cp {cp} {args.method} step memory per rank (worst rank, seq {args.seq}): ours {worst / 1024:.0f} MiB, "
              f"reference {ref['step_kib'] / 1024:.0f} MiB (1 process), ratio {worst / ref['step_kib']:.2f} "
              f"(1/cp = {1 / cp:.2f})")
        print(f"cp {cp} {args.method} step time: ours {slowest:.2f} s, reference {ref['seconds']:.2f} s "
              f"(1 process), ratio {slowest / ref['seconds']:.2f}", flush=True)
    if not (ref["peak_reset"] if ref else peak_reset):
        print("(/proc/self/clear_refs was not writable: memory is the RSS after the step, not its peak)")
    return 0


if __name__ == "__main__":
    if os.environ.get("MF_CP_BENCH_WORKER"):
        seq, method = os.environ["MF_CP_BENCH_WORKER"].split(",")
        worker(int(seq), method)
    else:
        sys.exit(main())
