"""Training throughput: mf's compiled step vs a hand-written MindSpore step vs PyTorch eager.

One llama (hidden 256, 4 layers, 4 heads, seq 256, batch 4, vocab 32000, untied head, ~20M
parameters) trained with AdamW (betas 0.9/0.95, weight decay 0.01 off norms) and global-norm
clipping at 1.0 on random tokens, from the same initial weights (mf's), by

  mf         mf-trainer's `StepRunner`: forward + backward + clip + AdamW compiled as one
             GRAPH_MODE graph (mf-models' LlamaForCausalLM, masked sparse cross entropy)
  ms-hand    the same step written in plain MindSpore without any mf import (_ms_handwritten.py:
             plain Cells, SparseSoftmaxCrossEntropyWithLogits, ops.clip_by_global_norm,
             mindspore.experimental.optim.AdamW), compiled whole in GRAPH_MODE: what MindSpore
             itself can do, the bar for mf's structure
  torch      the same architecture in PyTorch eager fp32: nn.Linear / SDPA attention (what HF's
             llama uses by default) / F.cross_entropy / torch.optim.AdamW / clip_grad_norm_

Each side runs in its own worker process; the parent alternates rounds of steps between them so
load on a shared machine hits all alike, and only one computes at a time. The machine's peak
fp32 GEMM rate is measured in the same run by numpy in subprocesses, once per OpenBLAS kernel
family (OPENBLAS_CORETYPE unset, SkylakeX, Haswell), the best taken: OpenBLAS's own detection
does not know every CPU a VM reports (on this machine's "Intel Xeon Processor" it falls back to
the Prescott kernels, 30-60 GFLOP/s, where SkylakeX's AVX-512 kernels reach ~300); MFU uses
mf-models' FLOPs per token (PaLM: 6N + attention) for every side.

Targets (issues 15, 28): mf >= 1.2x ms-hand and >= 1.35x torch in tokens/s, MFU >= 40%.

Then the size sweep (issue 28: how the cost grows): llamas of ~20M, 60M, 150M and 350M
parameters (vocabulary 32000, untied; hidden 256 / 512 / 768 / 1024, 4 / 8 / 14 / 24 layers) at
the same 1024 tokens per step, mf against PyTorch eager, one process, fp32: step time, MFU of
the GEMM peak measured in the run, and each worker's peak RSS (VmHWM: for mf it includes
compiling the graph), printed as one table. Each size runs in fresh workers, its sides one after
the other, each alone in memory (not interleaved as above): two 350M workers together outgrow a
24 GiB machine, and the sweep asks whether each side fits on its own.

PyTorch runs in the reference venv (benchmarks/.work/torchvenv, made by the nox bench session
with pip from requirements-reference.txt: see _references.py); without it the torch side is
skipped.

    python benchmarks/train_bench.py [--rounds 4] [--steps 5] [--sweep 20M,60M,150M,350M | --sweep none]
                                     [--only-sweep] [--micro-batches 1|2|4]

--micro-batches N runs the sweep's mf side with each step's batch as N micro-batches (gradient
accumulation, the same tokens per step): what fits where the whole batch at once does not.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from _references import SETUP_HINT, reference_python

MODEL = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 256, "intermediate_size": 688,
         "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 256,
         "seq_length": 256, "tie_word_embeddings": False, "rms_norm_eps": 1e-6}
BATCH, SEQ, LR, WD, BETAS, EPS, MAX_NORM = 4, 256, 1e-3, 0.01, (0.9, 0.95), 1e-8, 1.0
# Untimed steps before timing. mf's step settles over its first steps, not only the first
# (compiling) one: at 20M 0.62-0.71 s for steps 2-5, then 0.45-0.49 s; at 60M 2.2 s falling to
# 1.6 s by step 8 (the memory pool's fresh pages being touched); torch's settles by step 5 too.
# Timing steps 3-6, as the sweep once did, read 20M's mf step as 0.89 s against 0.57 s here.
WARM_STEPS, SWEEP_WARM_STEPS = 6, 6
# The sweep's llamas (head size 64 from 60M on), all at BATCH x SEQ tokens per step.
SIZES = {
    "20M": MODEL,
    "60M": {**MODEL, "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 8,
            "num_attention_heads": 8, "num_key_value_heads": 8},
    "150M": {**MODEL, "hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 14,
             "num_attention_heads": 12, "num_key_value_heads": 12},
    "350M": {**MODEL, "hidden_size": 1024, "intermediate_size": 2560, "num_hidden_layers": 24,
             "num_attention_heads": 16, "num_key_value_heads": 16},
}


def batch(step: int, vocab: int = MODEL["vocab_size"]):
    """The same random tokens for both sides: input ids [B, S] and next-token labels."""
    import numpy as np

    ids = np.random.RandomState(1000 + step).randint(0, vocab, (BATCH, SEQ + 1))
    return ids[:, :-1].astype(np.int64), ids[:, 1:].astype(np.int64)


def peak_rss() -> int:
    """This process's peak resident set (VmHWM), bytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ---------------------------------------------------------------------------------------- ours
class MfWorker:
    def __init__(self, weights_path: str, model: dict = MODEL, micro_batches: int = 1):
        os.environ.setdefault("GLOG_v", "3")
        import mindspore as ms
        import numpy as np

        import mf_models
        from mf_trainer import AdamW, decay_mask
        from mf_trainer.loss import MaskedLMLoss
        from mf_trainer.step import StepRunner

        ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
        self.model = mf_models.build_model(dict(model), seed=0)
        np.savez(weights_path, **mf_models.model_state(self.model))
        params = self.model.trainable_params()
        opt = AdamW(params, betas=BETAS, eps=EPS, weight_decay=WD, decay=decay_mask([p.name for p in params]))
        # micro_batches > 1: the same BATCH sequences per step as that many micro-batches
        # (gradient accumulation), to see what fits where the whole batch at once does not.
        if BATCH % micro_batches:
            raise ValueError(f"micro_batches {micro_batches} does not divide the batch of {BATCH}")
        self.micro_batches = micro_batches
        self.runner = StepRunner(MaskedLMLoss(self.model), opt, MAX_NORM, micro_batches)
        self.flops_per_token = self.model.num_flops_per_token(SEQ)
        self.params = sum(p.size for p in params)
        self.vocab = model["vocab_size"]
        self.step = 0

    def run(self, n: int):
        import numpy as np

        times, losses = [], []
        for _ in range(n):
            ids, labels = batch(self.step, self.vocab)
            per = BATCH // self.micro_batches
            mbs = [{"input_ids": ids[i:i + per], "labels": labels[i:i + per],
                    "loss_mask": np.ones((per, ids.shape[1]), np.float32)} for i in range(0, BATCH, per)]
            t0 = time.perf_counter()
            loss = self.runner(mbs, LR).loss
            times.append(time.perf_counter() - t0)
            losses.append(loss)
            self.step += 1
        return {"times": times, "losses": losses, "rss": peak_rss()}


# ------------------------------------------------------------------------ hand-written MindSpore
class MsHandWorker:
    def __init__(self, weights_path: str, model: dict = MODEL):
        os.environ.setdefault("GLOG_v", "3")
        import mindspore as ms
        import numpy as np
        from _ms_handwritten import build_step

        ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
        state = dict(np.load(weights_path))
        self.ms, self.np = ms, np
        self.step_cell = build_step(model, state, LR, BETAS, EPS, WD, MAX_NORM)
        self.step = 0
        self.version = ms.__version__

    def run(self, n: int):
        ms, np = self.ms, self.np
        times, losses = [], []
        for _ in range(n):
            ids, labels = batch(self.step)
            t0 = time.perf_counter()
            loss = self.step_cell(ms.Tensor(ids.astype(np.int32)), ms.Tensor(labels.astype(np.int32)))
            value = float(loss.asnumpy())
            times.append(time.perf_counter() - t0)
            losses.append(value)
            self.step += 1
        return {"times": times, "losses": losses, "rss": peak_rss()}


# ---------------------------------------------------------------------------------- PyTorch eager
class TorchWorker:
    def __init__(self, weights_path: str, model: dict = MODEL):
        import numpy as np
        import torch

        torch.manual_seed(0)
        self.torch = torch
        self.vocab = model["vocab_size"]
        self.model = _torch_llama(torch, model)
        state = np.load(weights_path)
        with torch.no_grad():
            for name, param in self.model.named_parameters():
                param.copy_(torch.from_numpy(state[name]))
        decay = [p for n, p in self.model.named_parameters() if "norm" not in n]
        no_decay = [p for n, p in self.model.named_parameters() if "norm" in n]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                                     lr=LR, betas=BETAS, eps=EPS)
        self.step = 0
        self.version = torch.__version__

    def run(self, n: int):
        torch = self.torch
        times, losses = [], []
        for _ in range(n):
            ids, labels = (torch.from_numpy(a) for a in batch(self.step, self.vocab))
            t0 = time.perf_counter()
            logits = self.model(ids)
            loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), labels.reshape(-1))
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), MAX_NORM)
            self.opt.step()
            value = loss.item()
            times.append(time.perf_counter() - t0)
            losses.append(value)
            self.step += 1
        return {"times": times, "losses": losses, "rss": peak_rss()}


def _torch_llama(torch, model: dict = MODEL):
    nn, F = torch.nn, torch.nn.functional
    H, L, NH = model["hidden_size"], model["num_hidden_layers"], model["num_attention_heads"]
    HD, V, FF, EPS_N = H // NH, model["vocab_size"], model["intermediate_size"], model["rms_norm_eps"]

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(H))

        def forward(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS_N))

    def rotate_half(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.wq, self.wk, self.wv, self.wo = (nn.Linear(H, H, bias=False) for _ in range(4))

        def forward(self, x, cos, sin):
            b, s, _ = x.shape
            q, k, v = (w(x).view(b, s, NH, HD).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.wo(out.transpose(1, 2).reshape(b, s, H))

    class FeedForward(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1, self.w3 = nn.Linear(H, FF, bias=False), nn.Linear(H, FF, bias=False)
            self.w2 = nn.Linear(FF, H, bias=False)

        def forward(self, x):
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm, self.attention = RMSNorm(), Attention()
            self.ffn_norm, self.feed_forward = RMSNorm(), FeedForward()

        def forward(self, x, cos, sin):
            x = x + self.attention(self.attention_norm(x), cos, sin)
            return x + self.feed_forward(self.ffn_norm(x))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok_embeddings = nn.Embedding(V, H)
            self.layers = nn.ModuleList(Block() for _ in range(L))
            self.norm, self.output = RMSNorm(), nn.Linear(H, V, bias=False)
            inv = 1.0 / (10000.0 ** (torch.arange(0, HD, 2, dtype=torch.float32) / HD))
            freqs = torch.outer(torch.arange(SEQ, dtype=torch.float32), inv)
            emb = torch.cat((freqs, freqs), dim=-1)
            self.register_buffer("cos", emb.cos(), persistent=False)
            self.register_buffer("sin", emb.sin(), persistent=False)

        def forward(self, ids):
            x = self.tok_embeddings(ids)
            for layer in self.layers:
                x = layer(x, self.cos, self.sin)
            return self.output(self.norm(x))

    return Llama()


def worker_main(kind: str, weights_path: str, model: dict, micro_batches: int = 1) -> None:
    """Serve `{"steps": n}` requests on stdin with one JSON line each on stdout."""
    out = sys.stdout
    sys.stdout = sys.stderr  # library chatter must not corrupt the protocol
    try:
        cls = {"mf": MfWorker, "ms-hand": MsHandWorker, "torch": TorchWorker}[kind]
        w = cls(weights_path, model, micro_batches) if kind == "mf" else cls(weights_path, model)
        info = {"ready": True}
        if kind == "mf":
            info.update(flops_per_token=w.flops_per_token, params=int(w.params))
        else:
            info.update(version=w.version)
    except Exception as exc:  # reported to the parent, which prints it
        info = {"ready": False, "error": f"{type(exc).__name__}: {exc}"}
    out.write(json.dumps(info) + "\n")
    out.flush()
    if not info["ready"]:
        return
    for line in sys.stdin:
        request = json.loads(line)
        out.write(json.dumps(w.run(int(request["steps"]))) + "\n")
        out.flush()


# --------------------------------------------------------------------------------------- parent
PEAK_PROBE = """
import time, numpy as np
n = 2048
a = np.random.rand(n, n).astype(np.float32); b = np.random.rand(n, n).astype(np.float32)
a @ b
best = 0.0
for _ in range(8):
    t = time.perf_counter(); a @ b; best = max(best, 2 * n ** 3 / (time.perf_counter() - t))
print(best)
"""


# OpenBLAS kernel families tried by the peak probe (None: OpenBLAS's own detection). An unknown
# name is not an error for OpenBLAS (it falls back to its detection), and a family the CPU lacks
# would die on an illegal instruction: such a probe is skipped.
PEAK_CORETYPES = (None, "SkylakeX", "Haswell")


def peak_flops() -> float:
    """The machine's best fp32 GEMM rate (FLOP/s) over PEAK_CORETYPES."""
    base = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    best = 0.0
    for core in PEAK_CORETYPES:
        env = base if core is None else {**base, "OPENBLAS_CORETYPE": core}
        out = subprocess.run([sys.executable, "-c", PEAK_PROBE], capture_output=True, text=True, env=env)
        if out.returncode == 0 and out.stdout.strip():
            best = max(best, float(out.stdout.strip()))
    if best <= 0.0:
        raise RuntimeError("the GEMM peak probe failed for every OpenBLAS kernel family")
    return best


class Worker:
    """A side in its own process; `run` returns None once the process has died (e.g. killed by
    the kernel's OOM killer: the sweep's larger sizes can outgrow the machine)."""

    def __init__(self, python: str, kind: str, weights: str, model: dict = MODEL, micro_batches: int = 1):
        self.kind = kind
        self.proc = subprocess.Popen([python, __file__, "--worker", kind, weights, json.dumps(model), str(micro_batches)],
                                     stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env={**os.environ, "GLOG_v": "3"})
        line = self.proc.stdout.readline()
        self.info = json.loads(line) if line else {"ready": False, "error": self.death()}

    def death(self) -> str:
        """Why the process ended, in words."""
        code = self.proc.wait(timeout=60)
        if code == -9:
            return (f"killed by SIGKILL (on this {_mem_total_gib():.0f} GiB machine most likely the kernel's "
                    "out-of-memory killer)")
        return f"exited with code {code}"

    def run(self, n: int) -> dict | None:
        try:
            self.proc.stdin.write(json.dumps({"steps": n}) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        return json.loads(line) if line else None

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        self.proc.wait(timeout=60)


def _mem_total_gib() -> float:
    with open("/proc/meminfo") as f:
        return int(f.readline().split()[1]) / 2**20


def sweep(sizes: list[str], rounds: int, steps: int, micro_batches: int = 1) -> None:
    """The size sweep (see the module doc): one table, one row per size and side. The sides of a
    size run one after the other, each alone in memory: two workers of the largest size together
    outgrow a 24 GiB machine, and whether a side fits is one of the sweep's questions. A side
    whose worker dies gets a row saying so, and the other side goes on alone."""
    tp = reference_python("import torch, numpy")
    rows, deaths = [], {}
    for size in sizes:
        model = SIZES[size]
        print(f"train_bench sweep: {size} ...", flush=True)
        load = os.getloadavg()[0]
        peak = peak_flops()
        times: dict[str, list[float]] = {}
        rss, info = {}, None
        with tempfile.TemporaryDirectory() as tmp:
            weights = os.path.join(tmp, "init.npz")
            for kind, python in (("mf", sys.executable), ("torch", tp)):
                if python is None or (kind == "torch" and info is None):
                    continue  # no reference venv, or no weights: the torch side loads those mf's worker writes
                worker = Worker(python, kind, weights, model, micro_batches if kind == "mf" else 1)
                if not worker.info["ready"]:
                    deaths[(size, kind)] = worker.info["error"]
                    print(f"train_bench sweep {size}: {kind} worker failed: {worker.info['error']}")
                    continue
                if kind == "mf":
                    info = worker.info
                timed = []
                for r in range(rounds + 1):  # round 0 compiles and warms (SWEEP_WARM_STEPS), untimed
                    out = worker.run(SWEEP_WARM_STEPS if r == 0 else steps)
                    if out is None:
                        deaths[(size, kind)] = worker.death()
                        print(f"train_bench sweep {size}: {kind} worker died in its first "
                              f"{'steps' if r == 0 else f'{r} timed rounds'}: {deaths[(size, kind)]}", flush=True)
                        break
                    timed += out["times"] if r else []
                    rss[kind] = out["rss"]
                else:
                    times[kind] = timed
                    worker.close()
        peak = max(peak, peak_flops())
        if info is None:
            continue
        fpt = info["flops_per_token"]
        step = {k: statistics.median(v) for k, v in times.items() if v}
        for k in ("mf", "torch"):
            if k in step:
                rows.append((size, info["params"], k, step[k], 100 * fpt * BATCH * SEQ / step[k] / peak, rss[k],
                             step["torch"] / step[k] if "torch" in step else float("nan"), peak, load))
    accumulate = f" (mf: {micro_batches} micro-batches of {BATCH // micro_batches}, torch: one batch)" if micro_batches > 1 else ""
    print(f"train_bench sweep: llama sizes at {BATCH} x {SEQ} tokens per step{accumulate}, fp32, one process, {rounds} rounds x "
          f"{steps} steps per side; MFU of the GEMM peak measured beside each size; RSS = the worker's peak "
          f"(VmHWM; mf's includes compiling the graph); machine memory {_mem_total_gib():.0f} GiB")
    print(f"{'size':>6} {'params':>9} {'side':>6} {'step s':>8} {'MFU %':>6} {'peak RSS MiB':>13} "
          f"{'torch/side':>11} {'peak GF/s':>10} {'load':>5}")
    for size, params, side, sec, mfu, peak_rss_bytes, ratio, peak, load in rows:
        print(f"{size:>6} {params / 1e6:8.1f}M {side:>6} {sec:8.3f} {mfu:6.1f} {peak_rss_bytes / 2**20:13.0f} "
              f"{ratio:11.2f} {peak / 1e9:10.0f} {load:5.1f}")
    for (size, side), why in deaths.items():
        print(f"{size:>6} {'':>9} {side:>6} did not run to the end: {why}")
    for size in sizes:
        got = {side: (sec, rss_b) for s, _, side, sec, _, rss_b, _, _, _ in rows if s == size}
        if "mf" in got and "torch" in got:
            print(f"train tokens/s {size} vs torch: ours {BATCH * SEQ / got['mf'][0]:.0f}, reference "
                  f"{BATCH * SEQ / got['torch'][0]:.0f} (PyTorch eager fp32), ratio "
                  f"{got['torch'][0] / got['mf'][0]:.2f}; peak RSS ours {got['mf'][1] / 2**20:.0f} MiB, reference "
                  f"{got['torch'][1] / 2**20:.0f} MiB, ratio {got['mf'][1] / got['torch'][1]:.2f}")
        elif "torch" in got and (size, "mf") in deaths:
            print(f"train tokens/s {size} vs torch: ours did not fit ({deaths[(size, 'mf')]}), reference "
                  f"{BATCH * SEQ / got['torch'][0]:.0f} at {got['torch'][1] / 2**20:.0f} MiB peak RSS")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds per side")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per round")
    parser.add_argument("--sweep", default=",".join(SIZES),
                        help=f"sizes of the sweep, comma-separated from {', '.join(SIZES)}; 'none' skips it")
    parser.add_argument("--sweep-rounds", type=int, default=2, help="alternating rounds per side and size")
    parser.add_argument("--sweep-steps", type=int, default=3, help="timed steps per round in the sweep")
    parser.add_argument("--only-sweep", action="store_true", help="skip the 20M three-way comparison")
    parser.add_argument("--micro-batches", type=int, default=1, choices=[d for d in range(1, BATCH + 1) if BATCH % d == 0],
                        help="the sweep's mf side takes each step's batch as this many micro-batches "
                             "(gradient accumulation; same tokens per step)")
    args = parser.parse_args()
    sizes = [] if args.sweep == "none" else [x.strip() for x in args.sweep.split(",") if x.strip()]
    unknown = [x for x in sizes if x not in SIZES]
    if unknown:
        parser.error(f"--sweep: unknown size {unknown[0]!r}; choose from {', '.join(SIZES)} or 'none'")
    if not args.only_sweep:
        rc = compare(args)
        if rc:
            return rc
    if sizes:
        sweep(sizes, args.sweep_rounds, args.sweep_steps, args.micro_batches)
    return 0


def _alive(worker: Worker, result: dict | None) -> dict:
    if result is None:
        raise SystemExit(f"train_bench: the {worker.kind} worker died: {worker.death()}")
    return result


def compare(args) -> int:
    """The 20M three-way comparison (mf, hand-written MindSpore, PyTorch)."""
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        weights = os.path.join(tmp, "init.npz")
        mf = Worker(sys.executable, "mf", weights)  # writes the initial weights the others load
        if not mf.info["ready"]:
            print(f"train_bench: mf worker failed: {mf.info['error']}")
            return 1
        sides = {"mf": mf}
        hand = Worker(sys.executable, "ms-hand", weights)
        if hand.info["ready"]:
            sides["ms-hand"] = hand
        else:
            print(f"train_bench: hand-written MindSpore worker failed: {hand.info['error']}")
        tp = reference_python("import torch, numpy")
        if tp:
            ref = Worker(tp, "torch", weights)
            if ref.info["ready"]:
                sides["torch"] = ref
            else:
                print(f"train_bench: torch worker failed: {ref.info['error']}")
        t0 = time.perf_counter()
        warm = {k: _alive(w, w.run(WARM_STEPS)) for k, w in sides.items()}  # the first step compiles the graphs
        peaks = [peak_flops()]
        times: dict[str, list[float]] = {k: [] for k in sides}
        for _ in range(args.rounds):
            for k, w in sides.items():
                times[k] += _alive(w, w.run(args.steps))["times"]
        peaks.append(peak_flops())
        for w in sides.values():
            w.close()
    tokens = BATCH * SEQ
    tps = {k: tokens / statistics.median(v) for k, v in times.items()}
    peak = max(peaks)
    fpt = mf.info["flops_per_token"]
    load_after = os.getloadavg()
    print(f"train_bench: llama {mf.info['params'] / 1e6:.1f}M params, batch {BATCH} x seq {SEQ}, fp32, "
          f"{args.rounds} rounds x {args.steps} steps per side, first step (compile) "
          + ", ".join(f"{k} {warm[k]['times'][0]:.1f} s" for k in sides) + f", wall {time.perf_counter() - t0:.0f} s")
    print(f"train_bench: load average {load_before[0]:.1f} before, {load_after[0]:.1f} after "
          "(a shared machine: figures are noisy; the ratios are measured side by side)")
    print("train_bench: step time median: " + ", ".join(f"{k} {statistics.median(v):.3f} s" for k, v in times.items()))
    print("train_bench: first losses: " + ", ".join(f"{k} {[round(x, 4) for x in warm[k]['losses'][:2]]}" for k in sides))
    names = {"ms-hand": f"hand-written MindSpore {sides['ms-hand'].info['version']} GRAPH_MODE step" if "ms-hand" in sides else "",
             "torch": f"PyTorch {sides['torch'].info['version']} eager fp32" if "torch" in sides else ""}
    for ref, target in (("ms-hand", 1.2), ("torch", 1.35)):
        if ref in tps:
            print(f"train tokens/s vs {ref}: ours {tps['mf']:.0f}, reference {tps[ref]:.0f} ({names[ref]}), "
                  f"ratio {tps['mf'] / tps[ref]:.2f} (target >= {target})")
        else:
            hint = f" ({SETUP_HINT})" if ref == "torch" else ""
            print(f"train tokens/s vs {ref}: ours {tps['mf']:.0f}, reference missing{hint}")
    if "ms-hand" in tps and "torch" in tps:
        print(f"train tokens/s, hand-written MindSpore vs PyTorch (for information): {tps['ms-hand']:.0f} vs "
              f"{tps['torch']:.0f}, ratio {tps['ms-hand'] / tps['torch']:.2f}")
    mfus = ", ".join(f"{k} {100 * fpt * v / peak:.1f}%" for k, v in tps.items())
    print(f"train MFU: ours {100 * fpt * tps['mf'] / peak:.1f}% of {peak / 1e9:.0f} GFLOP/s peak fp32 GEMM "
          f"(numpy, best OpenBLAS kernel family, measured in this run); all sides: {mfus} (target >= 40%)")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), int(sys.argv[5]))
    else:
        sys.exit(main())
