"""Where a decode step of mf's inference engine spends its time (issue 28): per kernel category, the
launches between kernels, the compiled call, and the engine's own Python around it.

    python benchmarks/profile_decode.py [--batch 1 4] [--steps 64]

Model: generate_bench's 20M llama (an HF directory written by mf-ckpt), GRAPH_MODE, prompts of 16
tokens, greedy. The engine generates --steps tokens per sequence once (compiling its graphs), then
again with every decode call timed and, in a third run, profiled (MindSpore's profiler on CPU:
every kernel launch and its duration, the prefills left out). Printed per decode step (medians):

  engine step      `InferenceEngine._decode_all`: inputs to tensors, the compiled call, the
                   tokens back, the requests' bookkeeping
  compiled call    the step Cell's call (graph launch, kernels, the [rows] token ids to the host)
  kernels          the sum of the kernels' durations, by category: the output projection (the
                   largest MatMul launch), the layers' linears, attention (BatchMatMul, Softmax),
                   the KV cache (ScatterUpdate writes, Gather reads), token choice (Argmax, sort
                   and the sampling ops), and the elementwise rest (norms, RoPE, SwiGLU, residuals,
                   mask)
  host             engine step - compiled call
  between kernels  a profiled decode step - its kernels: the runtime's launches and hand-offs
                   between kernels and the host's share (kernels of one step barely overlap:
                   each depends on the one before)

Profiling is not a benchmark (not in the nox `bench` session); on a loaded machine every figure
is inflated, the shares less so.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict

os.environ.setdefault("GLOG_v", "3")

from _hf_generate import HF_MODEL, write_hf_model  # noqa: E402

SAMPLING_OPS = {"Argmax", "Sort", "TopK", "Softmax_sample", "CumSum", "ReduceSum", "GatherD", "Select", "Minimum"}


def category(op_type: str, duration: float, head: float) -> str:
    if op_type == "MatMul":
        return "output projection" if duration >= head else "layer linears"
    if op_type in ("BatchMatMul", "Softmax"):
        return "attention"
    if op_type in ("ScatterUpdate", "Gather"):
        return "KV cache write/read (+ embedding)"
    if op_type in SAMPLING_OPS:
        return "token choice"
    return "elementwise (norms, RoPE, SwiGLU, residual, mask)"


def profile(engine, prompts, params) -> tuple[dict[str, float], float, float]:
    """(ms per decode step by category, kernels per decode step, ms per profiled decode step) from
    MindSpore's profiler, over the decode steps after the first (the prefills run before the
    profiler starts)."""
    from mindspore import Profiler

    requests = [engine.submit(p, params) for p in prompts]
    engine.step()                       # every prefill, and the first decode step
    before, seconds = engine.stats.decode_steps, engine.stats.decode_seconds
    out = tempfile.mkdtemp(prefix="profile-decode-")
    prof = Profiler(output_path=out)
    while not all(r.finished for r in requests):
        engine.step()
    prof.stop()
    calls = engine.stats.decode_steps - before
    wall = 1e3 * (engine.stats.decode_seconds - seconds) / calls
    prof.analyse()
    launches: list[tuple[str, float]] = []
    for frame in glob.glob(os.path.join(out, "*", "FRAMEWORK")):
        with open(os.path.join(frame, "cpu_op_execute_timestamp_0.txt")) as f:
            for line in f:
                full, _, times = line.rstrip("\n").split(";", 2)
                op_type = full.rsplit("/", 1)[-1].rsplit("-op", 1)[0]
                launches += [(op_type, float(item.split(",")[1])) for item in times.split()]
    shutil.rmtree(out, ignore_errors=True)
    matmuls = sorted((d for t, d in launches if t == "MatMul"), reverse=True)
    head = matmuls[calls - 1] if len(matmuls) >= calls else float("inf")  # one output projection per call
    per_cat: dict[str, float] = defaultdict(float)
    for op_type, duration in launches:
        per_cat[category(op_type, duration, head)] += duration / calls
    return dict(per_cat), len(launches) / calls, wall


def timed_run(engine, prompts, params) -> tuple[list[float], list[float]]:
    """ms of every `_decode_all` and of the compiled call inside it, over one generation."""
    call_ms: list[float] = []
    step_ms: list[float] = []
    build, decode_all = engine._decode_step, engine._decode_all

    def timed_step(*key):
        step = build(*key)

        def call(*inputs):
            start = time.perf_counter()
            out = step(*inputs).asnumpy()
            call_ms.append(1e3 * (time.perf_counter() - start))
            return _Ready(out)
        return call

    def timed_decode_all(active):
        start = time.perf_counter()
        decode_all(active)
        step_ms.append(1e3 * (time.perf_counter() - start))

    engine._decode_step, engine._decode_all = timed_step, timed_decode_all
    try:
        engine.generate(prompts, params)
    finally:
        del engine._decode_step, engine._decode_all   # the class's methods again
    return step_ms, call_ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--steps", type=int, default=64, help="tokens per sequence")
    args = parser.parse_args()
    import mindspore as ms
    import numpy as np

    import mf_models
    from mf_models.inference import InferenceEngine, SamplingParams

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    print(f"profile_decode: load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory(prefix="mf-profile-decode-") as tmp:
        write_hf_model(os.path.join(tmp, "llama20m"))
        model = mf_models.load_hf(os.path.join(tmp, "llama20m"))
    for batch in args.batch:
        prompts = np.random.default_rng(batch).integers(3, HF_MODEL["vocab_size"], (batch, 16)).tolist()
        engine = InferenceEngine(model, max_slots=batch, max_len=16 + args.steps, eos_token_ids=[])
        params = SamplingParams(max_new_tokens=args.steps, ignore_eos=True)
        engine.generate(prompts, params)  # compiles
        step_ms, call_ms = timed_run(engine, prompts, params)
        cats, kernels, profiled = profile(engine, prompts, params)
        step, call = statistics.median(step_ms), statistics.median(call_ms)
        kernel_sum = sum(cats.values())
        print(f"batch {batch}: engine step {step:.2f} ms = compiled call {call:.2f} + host {step - call:.2f} "
              f"(medians, unprofiled)", flush=True)
        print(f"  profiled: decode step {profiled:.2f} ms = kernels {kernel_sum:.2f} + between kernels and host "
              f"{profiled - kernel_sum:.2f} ({kernels:.0f} kernels a step)", flush=True)
        for name, ms_ in sorted(cats.items(), key=lambda kv: -kv[1]):
            print(f"  {name:52s} {ms_:6.2f} ms  {100 * ms_ / profiled:5.1f}% of the profiled step", flush=True)
    print(f"profile_decode: load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    return 0


class _Ready:
    """A host array posing as the step's output tensor (the engine calls .asnumpy() on it)."""

    def __init__(self, array):
        self.array = array

    def asnumpy(self):
        return self.array


if __name__ == "__main__":
    sys.exit(main())
