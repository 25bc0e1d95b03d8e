"""Serving under load: N concurrent clients against `mf serve` (continuous batching) on 127.0.0.1,
against Hugging Face transformers `generate` on static batches of the same N prompts.

    python benchmarks/serve_bench.py                       # 1, 4 and 16 clients, 128 new tokens
    python benchmarks/serve_bench.py --clients 4 --requests 3 --rounds 3

Model: the 20M llama of generate_bench.py, written as a Hugging Face directory (`_hf_generate.py`);
`mf serve` serves that directory (GRAPH_MODE, --max-slots = the largest client count), HF's
`AutoModelForCausalLM` loads it in the reference venv.

ours        N client threads in this process, each sending --requests completions one after the
            other (a closed loop) over HTTP/1.1 keep-alive: prompt = 16 token ids, max_tokens,
            temperature 0, ignore_eos, stream true (server-sent events). Each token's arrival is
            noted; tokens/s = every generated token / the phase's wall time.
reference   the same prompts in static batches of N (batch k = every client's k-th request),
            `model.generate(do_sample=False, use_cache=True)`; tokens/s = the tokens / the sum of
            the calls' wall times (no HTTP, no queueing: HF's best case).
time per output token: p50 / p99 of the gaps between a request's consecutive tokens (ours as the
client sees them, HF's between its consecutive decode steps, measured inside its loop).
Every request's tokens must equal HF's for its prompt (checked; the figure says so).

A warm-up phase per client count comes first (it compiles the decode graphs that count needs);
then --rounds rounds, ours and the reference alternating; each figure is the best round.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from urllib.parse import urlsplit

from _hf_generate import HF_MODEL, HFWorker, write_hf_model
from _references import SETUP_HINT, reference_python

PROMPT_LEN = 16


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    low = int(k)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


class Server:
    """`mf serve HF_DIR` in its own process, on a free port."""

    def __init__(self, hf_dir: str, slots: int, max_len: int):
        command = [sys.executable, "-m", "mf_cli.main", "serve", hf_dir, "--port", "0", "--max-slots", str(slots),
                   "--max-len", str(max_len), "--model-name", "llama20m"]
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "GLOG_v": "3"})
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            self.proc.kill()
            raise RuntimeError(f"mf serve did not start: {line.strip()} {self.proc.stderr.read()[-2000:]}")
        url = urlsplit(line.split("listening on", 1)[1].strip())
        self.host, self.port = url.hostname, url.port

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def stream_completion(conn: http.client.HTTPConnection, prompt: list[int], new: int) -> tuple[list[int], list[float], float]:
    """(token ids, arrival time of each, time the request was sent) of one streamed completion."""
    body = json.dumps({"model": "llama20m", "prompt": prompt, "max_tokens": new, "temperature": 0,
                       "ignore_eos": True, "stream": True})
    sent = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {response.read()[:300]!r}")
    tokens: list[int] = []
    times: list[float] = []
    while True:
        line = response.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            break
        now = time.perf_counter()
        for choice in json.loads(data)["choices"]:
            ids = choice.get("token_ids") or []
            tokens.extend(ids)
            times.extend([now] * len(ids))
    response.read()
    return tokens, times, sent


def run_clients(server: Server, prompts: list[list[list[int]]], new: int) -> dict:
    """Every client i sends prompts[i] one after the other; returns the phase's figures."""
    results: list[list[tuple[list[int], list[float], float]]] = [[] for _ in prompts]
    errors: list[str] = []
    barrier = threading.Barrier(len(prompts) + 1)

    def client(i: int) -> None:
        conn = http.client.HTTPConnection(server.host, server.port, timeout=600)
        try:
            barrier.wait()
            for prompt in prompts[i]:
                results[i].append(stream_completion(conn, prompt, new))
        except Exception as exc:  # reported by the phase
            errors.append(f"client {i}: {type(exc).__name__}: {exc}")
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError("; ".join(errors))
    gaps = [b - a for per_client in results for _, times, _ in per_client for a, b in zip(times, times[1:])]
    first = [times[0] - sent for per_client in results for _, times, sent in per_client if times]
    generated = sum(len(tokens) for per_client in results for tokens, _, _ in per_client)
    return {"tps": generated / wall, "gaps": gaps, "ttft": first,
            "tokens": [[tokens for tokens, _, _ in per_client] for per_client in results]}


def run_reference(hf: HFWorker, prompts: list[list[list[int]]], new: int) -> dict:
    """The same prompts as static batches: batch k holds every client's k-th prompt."""
    clients, per_client = len(prompts), len(prompts[0])
    tokens: list[list[list[int]]] = [[] for _ in range(clients)]
    gaps: list[float] = []
    first: list[float] = []
    seconds = 0.0
    for k in range(per_client):
        out = hf.generate([prompts[i][k] for i in range(clients)], new)
        seconds += out["seconds"]
        steps = out["steps"]
        gaps += [b - a for a, b in zip(steps, steps[1:])]
        first.append(steps[0])
        for i in range(clients):
            tokens[i].append(out["tokens"][i])
    return {"tps": clients * per_client * new / seconds, "gaps": gaps, "ttft": first, "tokens": tokens}


def main() -> int:
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--requests", type=int, default=2, help="requests per client per round")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(f"serve_bench: load average {load()} at the start (a shared machine: figures taken under load are marked "
          "'loaded' in the notes)", flush=True)
    with tempfile.TemporaryDirectory(prefix="mf-serve-bench-") as tmp:
        hf_dir = os.path.join(tmp, "llama20m")
        params = write_hf_model(hf_dir)
        python = reference_python("import torch, transformers")
        hf = HFWorker(python, hf_dir) if python else None
        if hf is not None and not hf.info["ready"]:
            print(f"serve_bench: HF worker failed: {hf.info['error']}")
            hf = None
        started = time.perf_counter()
        server = Server(hf_dir, max(args.clients), PROMPT_LEN + args.new_tokens)
        versions = (f"transformers {hf.info['transformers']}, torch {hf.info['torch']} with {hf.info['threads']} "
                    "threads" if hf is not None else "no reference")
        print(f"model: llama 20M ({params / 1e6:.1f}M parameters, float32) as an HF directory; mf serve --max-slots "
              f"{max(args.clients)} up in {time.perf_counter() - started:.0f} s; reference: {versions}; "
              f"{args.requests} requests per client per round, prompts {PROMPT_LEN} tokens, {args.new_tokens} new, "
              "greedy", flush=True)
        try:
            for clients in args.clients:
                rng = np.random.default_rng(clients)
                shape = (clients, args.requests, PROMPT_LEN)
                warm = rng.integers(3, HF_MODEL["vocab_size"], shape).tolist()
                run_clients(server, warm, args.new_tokens)
                if hf is not None:
                    run_reference(hf, warm, args.new_tokens)
                ours, ref = [], []
                same = total = 0
                for _ in range(args.rounds):
                    batch = rng.integers(3, HF_MODEL["vocab_size"], shape).tolist()
                    ours.append(run_clients(server, batch, args.new_tokens))
                    if hf is not None:
                        ref.append(run_reference(hf, batch, args.new_tokens))
                        for a, b in zip(ours[-1]["tokens"], ref[-1]["tokens"]):
                            same += sum(x == y for x, y in zip(a, b))
                            total += len(a)
                best = max(ours, key=lambda r: r["tps"])
                label = f"{clients} client{'s' if clients > 1 else ''}, {args.new_tokens} new tokens"
                tpot = (f"time per output token p50 {1e3 * percentile(best['gaps'], 0.5):.1f} / p99 "
                        f"{1e3 * percentile(best['gaps'], 0.99):.1f} ms, first token p50 "
                        f"{1e3 * percentile(best['ttft'], 0.5):.0f} ms")
                if hf is None:
                    print(f"serve tokens/s ({label}): ours {best['tps']:.1f}, reference missing ({SETUP_HINT}); {tpot}",
                          flush=True)
                    continue
                rbest = max(ref, key=lambda r: r["tps"])
                agree = "same greedy tokens" if same == total else f"greedy tokens differ in {total - same} of {total} requests"
                print(f"serve tokens/s ({label}): ours {best['tps']:.1f}, reference {rbest['tps']:.1f} (HF generate, "
                      f"static batch of {clients}), ratio {best['tps'] / rbest['tps']:.2f}; {agree}", flush=True)
                print(f"serve time per output token ({label}): ours p50 {1e3 * percentile(best['gaps'], 0.5):.1f} / p99 "
                      f"{1e3 * percentile(best['gaps'], 0.99):.1f} ms, reference p50 "
                      f"{1e3 * percentile(rbest['gaps'], 0.5):.1f} / p99 {1e3 * percentile(rbest['gaps'], 0.99):.1f} ms, "
                      f"ratio {percentile(rbest['gaps'], 0.5) / percentile(best['gaps'], 0.5):.2f} at p50 (reference / "
                      f"ours); first token p50 ours {1e3 * percentile(best['ttft'], 0.5):.0f} ms (queueing included), "
                      f"reference {1e3 * percentile(rbest['ttft'], 0.5):.0f} ms", flush=True)
        finally:
            server.close()
            if hf is not None:
                hf.close()
    print(f"serve_bench: load average {load()} at the end", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
