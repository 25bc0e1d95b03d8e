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
fp32 GEMM rate is measured in the same run by numpy in a subprocess whose environment lacks
OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE (with them set OpenBLAS picks a slower kernel); MFU uses
mf-models' FLOPs per token (PaLM: 6N + attention) for every side.

Targets (issue 15): mf >= 1.1x ms-hand and >= 1.3x torch in tokens/s, MFU >= 40%.

PyTorch runs in the reference venv (benchmarks/.work/torchvenv, made by the nox bench session
with pip from requirements-reference.txt: see _references.py); without it the torch side is
skipped.

    python benchmarks/train_bench.py [--rounds 4] [--steps 5]
"""

from __future__ import annotations

import argparse
import json
import os
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


def batch(step: int):
    """The same random tokens for both sides: input ids [B, S] and next-token labels."""
    import numpy as np

    ids = np.random.RandomState(1000 + step).randint(0, MODEL["vocab_size"], (BATCH, SEQ + 1))
    return ids[:, :-1].astype(np.int64), ids[:, 1:].astype(np.int64)


# ---------------------------------------------------------------------------------------- ours
class MfWorker:
    def __init__(self, weights_path: str):
        os.environ.setdefault("GLOG_v", "3")
        import mindspore as ms
        import numpy as np

        import mf_models
        from mf_trainer import AdamW, decay_mask
        from mf_trainer.loss import MaskedLMLoss
        from mf_trainer.step import StepRunner

        ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
        self.model = mf_models.build_model(dict(MODEL), seed=0)
        np.savez(weights_path, **mf_models.model_state(self.model))
        params = self.model.trainable_params()
        opt = AdamW(params, betas=BETAS, eps=EPS, weight_decay=WD, decay=decay_mask([p.name for p in params]))
        self.runner = StepRunner(MaskedLMLoss(self.model), opt, MAX_NORM, 1)
        self.flops_per_token = self.model.num_flops_per_token(SEQ)
        self.params = sum(p.size for p in params)
        self.step = 0

    def run(self, n: int):
        import numpy as np

        times, losses = [], []
        for _ in range(n):
            ids, labels = batch(self.step)
            mb = {"input_ids": ids, "labels": labels, "loss_mask": np.ones(ids.shape, np.float32)}
            t0 = time.perf_counter()
            loss = self.runner([mb], LR).loss
            times.append(time.perf_counter() - t0)
            losses.append(loss)
            self.step += 1
        return {"times": times, "losses": losses}


# ------------------------------------------------------------------------ hand-written MindSpore
class MsHandWorker:
    def __init__(self, weights_path: str):
        os.environ.setdefault("GLOG_v", "3")
        import mindspore as ms
        import numpy as np
        from _ms_handwritten import build_step

        ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
        state = dict(np.load(weights_path))
        self.ms, self.np = ms, np
        self.step_cell = build_step(MODEL, state, LR, BETAS, EPS, WD, MAX_NORM)
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
        return {"times": times, "losses": losses}


# ---------------------------------------------------------------------------------- PyTorch eager
class TorchWorker:
    def __init__(self, weights_path: str):
        import numpy as np
        import torch

        torch.manual_seed(0)
        self.torch = torch
        self.model = _torch_llama(torch)
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
            ids, labels = (torch.from_numpy(a) for a in batch(self.step))
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
        return {"times": times, "losses": losses}


def _torch_llama(torch):
    nn, F = torch.nn, torch.nn.functional
    H, L, NH = MODEL["hidden_size"], MODEL["num_hidden_layers"], MODEL["num_attention_heads"]
    HD, V, FF, EPS_N = H // NH, MODEL["vocab_size"], MODEL["intermediate_size"], MODEL["rms_norm_eps"]

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


def worker_main(kind: str, weights_path: str) -> None:
    """Serve `{"steps": n}` requests on stdin with one JSON line each on stdout."""
    out = sys.stdout
    sys.stdout = sys.stderr  # library chatter must not corrupt the protocol
    try:
        w = {"mf": MfWorker, "ms-hand": MsHandWorker, "torch": TorchWorker}[kind](weights_path)
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


def peak_flops() -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    out = subprocess.run([sys.executable, "-c", PEAK_PROBE], capture_output=True, text=True, env=env, check=True)
    return float(out.stdout.strip())


class Worker:
    def __init__(self, python: str, kind: str, weights: str):
        self.proc = subprocess.Popen([python, __file__, "--worker", kind, weights], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env={**os.environ, "GLOG_v": "3"})
        self.info = json.loads(self.proc.stdout.readline() or '{"ready": false, "error": "worker died"}')

    def run(self, n: int) -> dict:
        self.proc.stdin.write(json.dumps({"steps": n}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds per side")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per round")
    args = parser.parse_args()
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
        warm = {k: w.run(2) for k, w in sides.items()}  # the first step compiles the graphs
        peaks = [peak_flops()]
        times: dict[str, list[float]] = {k: [] for k in sides}
        for _ in range(args.rounds):
            for k, w in sides.items():
                times[k] += w.run(args.steps)["times"]
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
    print("train_bench: first losses: " + ", ".join(f"{k} {[round(x, 4) for x in warm[k]['losses']]}" for k in sides))
    names = {"ms-hand": f"hand-written MindSpore {sides['ms-hand'].info['version']} GRAPH_MODE step" if "ms-hand" in sides else "",
             "torch": f"PyTorch {sides['torch'].info['version']} eager fp32" if "torch" in sides else ""}
    for ref, target in (("ms-hand", 1.1), ("torch", 1.3)):
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
          f"(numpy, OPENBLAS_* unset, measured in this run); all sides: {mfus} (target >= 40%)")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2], sys.argv[3])
    else:
        sys.exit(main())
