"""Per-op profile of one training step, side by side: mf's step, the hand-written MindSpore step
and PyTorch eager (the three sides of train_bench.py, same model, same weights).

    python benchmarks/profile_step.py [--steps 3] [--top 12] [--size 20M|60M|150M|350M]

--size picks one of train_bench's sweep llamas (default 20M, the three-way comparison's model).

MindSpore sides: `mindspore.Profiler` on CPU records every kernel launch (scope name, duration);
PyTorch: `torch.profiler` (self CPU time of every aten op, shapes recorded, the step's phases
marked with record_function). Each kernel is put in one category (linears, the logits
projection, attention GEMMs, mask + softmax, norms, RoPE and head transposes, SwiGLU, loss,
optimizer, clip, embedding, other) by op type, scope and input shapes; the table gives ms per
step and the share of the side's summed kernel time. Kernels of one step can overlap (MindSpore
runs independent kernels on several threads), so the sum can exceed the step's wall time,
which is printed too. Profiling is not a benchmark: not part of the nox `bench` session, and
slower than an unprofiled step; compare shares and ratios, not absolute times.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict

from _references import SETUP_HINT, reference_python, run_side

CATEGORIES = [
    "layer linears (q k v o, w1 w2 w3)", "logits projection", "attention GEMMs (q.k, p.v)",
    "attention mask + softmax", "norms (RMSNorm)", "RoPE + head reshapes/transposes", "SwiGLU elementwise",
    "residual adds", "loss (cross entropy)", "embedding", "grad norm + clip", "optimizer (AdamW)",
    "other (torch: the backward's elementwise ops)",
]


# ------------------------------------------------------------------------------------ MindSpore
def ms_category(full: str, op_type: str) -> str:
    """The category of a kernel from its scope and type (MatMul is split by the caller)."""
    scope = full.rsplit("/", 1)[0]
    if "optimizer" in scope:
        return "optimizer (AdamW)"
    if op_type == "BatchMatMul":
        return "attention GEMMs (q.k, p.v)"
    if op_type in ("LogSoftmax", "LogSoftmaxGrad", "GatherD", "GatherDGradV2", "SparseSoftmaxCrossEntropyWithLogits") \
            or "SparseSoftmaxCrossEntropy" in scope or "LogSoftmax" in scope or "Grad_SumExt" in scope \
            or scope.endswith("loss_cell-MaskedLMLoss") or scope.endswith("loss_cell-LossCell"):
        return "loss (cross entropy)"
    if "_Softmax" in scope or op_type in ("Softmax", "MaskedFill") or "core-CoreAttention" in scope:
        return "attention mask + softmax"
    if "RMSNorm" in scope:
        return "norms (RMSNorm)"
    if "rope" in scope.lower() or scope.endswith("attention-Attention") or "attention-Attention/Grad_" in scope:
        return "RoPE + head reshapes/transposes"
    if "SiLU" in scope or "feed_forward" in scope:
        return "SwiGLU elementwise"
    if "tok_embeddings" in scope or op_type == "UnsortedSegmentSum":
        return "embedding"
    if "GradNorm" in scope or op_type in ("IsFinite", "LogicalAnd", "Reciprocal", "Minimum", "Sqrt", "Square") \
            or scope in ("Default", "Expand/_SumExt", "Default/clip_by_global_norm"):
        return "grad norm + clip"
    if op_type in ("Add", "AddN") and ("TransformerBlock" in scope or "Block" in scope):
        return "residual adds"
    return "other (torch: the backward's elementwise ops)"


def ms_profile(kind: str, weights: str, steps: int, model: dict) -> dict:
    os.environ.setdefault("GLOG_v", "3")
    import train_bench
    from mindspore import Profiler

    worker = train_bench.MfWorker(weights, model) if kind == "mf" else train_bench.MsHandWorker(weights, model)
    worker.run(2)  # compile and warm
    out = tempfile.mkdtemp(prefix=f"profile-{kind}-")
    prof = Profiler(output_path=out)
    wall = worker.run(steps)["times"]
    prof.stop()
    prof.analyse()
    frame = glob.glob(os.path.join(out, "*", "FRAMEWORK"))[0]
    per_cat: dict[str, float] = defaultdict(float)
    per_op: dict[str, float] = defaultdict(float)
    matmuls: dict[bool, list[float]] = {False: [], True: []}  # forward / backward launches, ms
    with open(os.path.join(frame, "cpu_op_execute_timestamp_0.txt")) as f:
        for line in f:
            full, _, launches = line.rstrip("\n").split(";", 2)
            name = full.rsplit("/", 1)[-1]
            op_type = name.rsplit("-op", 1)[0]
            durations = [float(item.split(",")[1]) for item in launches.split()]
            if op_type == "MatMul":
                matmuls[full.startswith("Gradients")].extend(durations)
                continue
            cat = ms_category(full, op_type)
            per_cat[cat] += sum(durations) / steps
            per_op[f"{op_type} [{cat}]"] += sum(durations) / steps
    shutil.rmtree(out, ignore_errors=True)
    # Scope names do not tell the logits projection from the layers' linears (mf's linears share
    # one MatMul primitive, so MindSpore names every launch after the first cell that used it),
    # and the recorded shapes are keyed by names that repeat across graphs. Work does tell: the
    # [1024, 256] x [256, 32000] GEMM is ~50x any layer's, so per step the largest forward launch
    # and the two largest backward launches (dX, dW) are the logits projection.
    for backward, durations in matmuls.items():
        durations.sort(reverse=True)
        k = (2 if backward else 1) * steps
        for cat, part in (("logits projection", durations[:k]), ("layer linears (q k v o, w1 w2 w3)", durations[k:])):
            per_cat[cat] += sum(part) / steps
            per_op[f"MatMul {'backward' if backward else 'forward'} [{cat}]"] += sum(part) / steps
    return {"wall_ms": 1e3 * statistics.median(wall), "categories": dict(per_cat), "ops": dict(per_op)}


# -------------------------------------------------------------------------------------- PyTorch
def torch_category(name: str, shapes: str, phase: str) -> str | None:
    if phase == "optimizer":
        return "optimizer (AdamW)"
    if phase == "clip":
        return "grad norm + clip"
    if name in ("aten::mm", "aten::addmm", "aten::bmm") and "32000" in shapes:
        return "logits projection"
    if name in ("aten::mm", "aten::addmm"):
        return "layer linears (q k v o, w1 w2 w3)"
    if "scaled_dot_product" in name or "flash_attention" in name or name == "aten::bmm":
        return "attention GEMMs (q.k, p.v)"  # fused kernel on CPU: GEMMs, mask and softmax in one
    if "log_softmax" in name or "nll_loss" in name or "cross_entropy" in name:
        return "loss (cross entropy)"
    if "embedding" in name or "index_select" in name:
        return "embedding"
    if phase in ("RMSNorm",):
        return "norms (RMSNorm)"
    if phase == "Attention":  # what Attention.forward runs besides its linears and SDPA
        return "RoPE + head reshapes/transposes"
    if phase in ("FeedForward",):
        return "SwiGLU elementwise"
    return "other (torch: the backward's elementwise ops)"


def torch_profile(weights: str, steps: int, model_args: dict) -> dict:
    import torch
    import train_bench
    from torch.profiler import ProfilerActivity, profile, record_function

    worker = train_bench.TorchWorker(weights, model_args)
    worker.run(2)
    model, opt = worker.model, worker.opt
    # Forward phases by module (backward ops carry no module: they are counted by op name).
    for module in model.modules():
        kind = type(module).__name__
        if kind in ("RMSNorm", "FeedForward", "Attention"):
            def pre(mod, args, kind=kind):
                mod._rf = record_function(kind)
                mod._rf.__enter__()

            def post(mod, args, result):
                mod._rf.__exit__(None, None, None)

            module.register_forward_pre_hook(pre)
            module.register_forward_hook(post)
    wall = []
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for step in range(steps):
            ids, labels = (torch.from_numpy(a) for a in train_bench.batch(100 + step, model_args["vocab_size"]))
            t0 = time.perf_counter()
            logits = model(ids)
            with record_function("loss"):
                loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), labels.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            with record_function("clip"):
                torch.nn.utils.clip_grad_norm_(model.parameters(), train_bench.MAX_NORM)
            with record_function("optimizer"):
                opt.step()
            loss.item()
            wall.append(time.perf_counter() - t0)
    per_cat: dict[str, float] = defaultdict(float)
    per_op: dict[str, float] = defaultdict(float)
    phases = {"RMSNorm", "FeedForward", "Attention", "clip", "optimizer", "loss"}

    def walk(event, phase):
        if event.name in phases:
            phase = event.name
        if event.name.startswith("aten::") and event.self_cpu_time_total > 0:
            shapes = str(event.input_shapes) if event.input_shapes else ""
            cat = torch_category(event.name, shapes, phase or "")
            ms_self = event.self_cpu_time_total / 1e3 / steps
            per_cat[cat] += ms_self
            per_op[f"{event.name} [{cat}]"] += ms_self
        for child in event.cpu_children:
            walk(child, phase)

    for event in prof.events():
        if event.cpu_parent is None:
            walk(event, None)
    return {"wall_ms": 1e3 * statistics.median(wall), "categories": dict(per_cat), "ops": dict(per_op),
            "version": torch.__version__}


# --------------------------------------------------------------------------------------- parent
def side_result(python: str, kind: str, weights: str, steps: int, model: dict) -> dict | None:
    return run_side(python, [__file__, "--side", kind, weights, str(steps), json.dumps(model)], f"profile_step: {kind}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3, help="profiled steps per side (after 2 warm-up steps)")
    ap.add_argument("--top", type=int, default=12, help="ops listed per side")
    ap.add_argument("--size", default="20M", help="which of train_bench's sweep llamas (20M, 60M, 150M, 350M)")
    args = ap.parse_args()
    import train_bench

    if args.size not in train_bench.SIZES:
        ap.error(f"--size: unknown size {args.size!r}; choose from {', '.join(train_bench.SIZES)}")
    model = train_bench.SIZES[args.size]
    with tempfile.TemporaryDirectory() as tmp:
        weights = os.path.join(tmp, "init.npz")
        import mf_models  # the initial weights every side starts from (mf's init)
        np_state = mf_models.model_state(mf_models.build_model(dict(model), seed=0))
        import numpy as np

        np.savez(weights, **np_state)
        results = {}
        for kind in ("mf", "ms-hand"):
            results[kind] = side_result(sys.executable, kind, weights, args.steps, model)
        tp = reference_python("import torch, numpy")
        if tp:
            results["torch"] = side_result(tp, "torch", weights, args.steps, model)
        else:
            print(f"profile_step: torch side skipped ({SETUP_HINT})")
    sides = [k for k, v in results.items() if v]
    print(f"# llama {args.size}; per-step kernel time by category, ms (share of the side's summed kernel time); load average "
          f"{os.getloadavg()[0]:.1f}")
    print(f"{'category':46s}" + "".join(f"{k:>20s}" for k in sides))
    for cat in CATEGORIES:
        row = f"{cat:46s}"
        for k in sides:
            total = sum(results[k]["categories"].values())
            v = results[k]["categories"].get(cat, 0.0)
            row += f"{v:12.1f} ({100 * v / total:4.1f}%)"
        print(row)
    print(f"{'sum of kernel times':46s}" + "".join(f"{sum(results[k]['categories'].values()):12.1f}        " for k in sides))
    layer_cats = CATEGORIES[:8] + CATEGORIES[-1:]  # everything a decoder layer runs (fwd + bwd)
    n_layers = model["num_hidden_layers"]
    print(f"{'per decoder layer (those above / ' + str(n_layers) + ')':46s}"
          + "".join(f"{sum(results[k]['categories'].get(c, 0.0) for c in layer_cats) / n_layers:12.1f}        "
                    for k in sides))
    print(f"{'step wall time (profiled)':46s}" + "".join(f"{results[k]['wall_ms']:12.1f}        " for k in sides))
    for k in sides:
        top = sorted(results[k]["ops"].items(), key=lambda kv: -kv[1])[: args.top]
        print(f"# {k}: top ops, ms per step")
        for name, v in top:
            print(f"  {v:9.1f}  {name}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--side":
        kind, weights, steps, side_model = sys.argv[2], sys.argv[3], int(sys.argv[4]), json.loads(sys.argv[5])
        result = torch_profile(weights, steps, side_model) if kind == "torch" else ms_profile(kind, weights, steps,
                                                                                                side_model)
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        sys.exit(main())
