"""Where the memory of one training step goes, against what its graph needs (MindSpore 2.10, CPU).

    python benchmarks/profile_memory.py [--size 60M] [--layers 4] [--batches 1,4] [--no-control]

For mf's step (train_bench's llama at --size, --layers deep, each of --batches sequences of 256
tokens) and, as a control with no mf code in it, a plain chain of MatMul -> ReLU -> scale layers,
each in its own interpreter:

- step growth: resident memory after the first step minus before it, the graph compiled already
  (VmRSS; the pool never gives memory back, so this is the step's high-water mark);
- optimizer state: AdamW's two moments, made at the first step (2 x parameters x 4 bytes);
- graph need: the largest amount of kernel outputs alive at once when every output is freed right
  after its last reader, in the order the runtime launched the kernels (its memory tracker's task
  list), read from the compiled kernel graph (MS_DEV_SAVE_GRAPHS); the gradients and everything
  else the graph returns stay alive to its end;
- best fit: the arena a best-fit allocator (splitting, coalescing) reaches on the same sequence
  of allocations and frees, i.e. what fragmentation would add;
- all outputs: the sum of every kernel output of the step, as if nothing were ever reused;
- excess: step growth - optimizer state - graph need.

The figures of record and what they mean are in benchmarks/README.md. Parsing the IR dump and the
tracker's CSV depends on MindSpore's text formats (2.10 here): a profile, not a benchmark, and not
part of the nox `bench` session.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import glob
import json
import os
import re
import sys
import tempfile
from collections import defaultdict

from _references import run_side

MiB = 2 ** 20
DTYPE_BYTES = {"Float32": 4, "Int32": 4, "Bool": 1, "Float16": 2, "BFloat16": 2, "Int64": 8, "UInt8": 1, "Float64": 8}
# Nodes that launch no kernel and own no memory of their own.
NO_MEMORY = {"MakeTuple", "TupleGetItem", "Load", "UpdateState", "Depend", "Return"}
NODE = re.compile(r"^  %(\d+)\([^)]*\) = ([A-Za-z_0-9]+)\((.*)$")
TENSOR = re.compile(r"Tensor\[(\w+)\], \(([0-9, ]*)\)")


def _tensor_bytes(text: str) -> int:
    total = 0
    for dtype, shape in TENSOR.findall(text):
        n = 1
        for d in shape.split(","):
            if d.strip():
                n *= int(d)
        total += n * DTYPE_BYTES.get(dtype, 4)
    return total


def read_kernel_graph(path: str) -> tuple[dict, list]:
    """{node id: {op, args, bytes, scope}} and the listing order of a kernel graph IR dump."""
    lines = open(path, encoding="utf-8").read().split("\n")
    nodes, listing = {}, []
    for i, line in enumerate(lines):
        m = NODE.match(line)
        if not m:
            continue
        nid, op, rest = int(m.group(1)), m.group(2), m.group(3)
        types = lines[i + 1] if i + 1 < len(lines) else ""
        scope = next((lines[j].split("(", 1)[1].rstrip(")") for j in range(i + 1, min(i + 8, len(lines)))
                      if "Fullname with scope" in lines[j]), "")
        nodes[nid] = {"op": op, "args": [int(a) for a in re.findall(r"%(\d+)", rest)], "scope": scope,
                      "bytes": 0 if op in NO_MEMORY else _tensor_bytes(types.split("->", 1)[1] if "->" in types else "")}
        listing.append(nid)
    return nodes, listing


def launch_order(nodes: dict, listing: list, tasks_csv: str) -> list:
    """The graph's nodes in the order the runtime last launched them (the tracker's task list names
    each launch by the node's scope); nodes that launch nothing go right after their last input."""
    last_launch = {}
    with open(tasks_csv, newline="", encoding="utf-8") as f:
        for k, row in enumerate(csv.DictReader(f)):
            last_launch[row["node_name"]] = k
    launched = sorted((n for n in listing if nodes[n]["scope"] in last_launch),
                      key=lambda n: last_launch[nodes[n]["scope"]])
    order, placed = list(launched), set(launched)
    for n in listing:
        if n not in placed:
            at = max((order.index(a) for a in nodes[n]["args"] if a in placed), default=-1) + 1
            order.insert(at, n)
            placed.add(n)
    return order


def _frees(nodes: dict, listing: list, order: list) -> dict:
    """{position in order: nodes whose last reader runs there}; returned outputs never free."""
    position = {n: k for k, n in enumerate(order)}
    last = {n: k for k, n in enumerate(order)}  # an output nobody reads frees right away
    for k, n in enumerate(order):
        for a in nodes[n]["args"]:
            if a in position:
                last[a] = max(last[a], k)
    final = nodes[listing[-1]]
    for a in (final["args"] if final["op"] == "MakeTuple" else []):
        last[a] = len(order)
    frees = defaultdict(list)
    for n, k in last.items():
        frees[k].append(n)
    return frees


def graph_need(nodes: dict, listing: list, order: list) -> int:
    """Peak bytes of outputs alive at once, each freed after its last reader."""
    frees = _frees(nodes, listing, order)
    live = peak = 0
    for k, n in enumerate(order):
        live += nodes[n]["bytes"]
        peak = max(peak, live)
        live -= sum(nodes[a]["bytes"] for a in frees.get(k, ()))
    return peak


def best_fit_arena(nodes: dict, listing: list, order: list, align: int = 512) -> int:
    """Arena size a best-fit allocator (split on allocation, coalesce on free) reaches on the same
    allocations and frees as graph_need."""
    frees = _frees(nodes, listing, order)
    free: list[tuple[int, int]] = []  # (address, size), sorted by address
    top = 0
    placed = {}

    def allocate(size: int) -> int:
        nonlocal top
        fits = [i for i, (_, s) in enumerate(free) if s >= size]
        if fits:
            i = min(fits, key=lambda j: free[j][1])
            addr, s = free.pop(i)
            if s > size:
                bisect.insort(free, (addr + size, s - size))
            return addr
        if free and sum(free[-1]) == top:  # grow the free segment at the top instead of a new one
            addr, _ = free.pop()
        else:
            addr = top
        top = addr + size
        return addr

    def release(addr: int, size: int) -> None:
        bisect.insort(free, (addr, size))
        i = free.index((addr, size))
        if i + 1 < len(free) and sum(free[i]) == free[i + 1][0]:
            free[i] = (free[i][0], free[i][1] + free.pop(i + 1)[1])
        if i and sum(free[i - 1]) == free[i][0]:
            free[i - 1] = (free[i - 1][0], free[i - 1][1] + free.pop(i)[1])

    for k, n in enumerate(order):
        size = -(-nodes[n]["bytes"] // align) * align
        if size:
            placed[n] = (allocate(size), size)
        for a in frees.get(k, ()):
            if a in placed:
                release(*placed.pop(a))
    return top


def analyse(dump_dir: str) -> dict:
    """Graph need, best fit and all outputs of the largest kernel graph the child compiled."""
    graphs = glob.glob(os.path.join(dump_dir, "ir", "graph_build_*.ir"))
    tasks = os.path.join(dump_dir, "tracker", "task.csv")
    if not graphs or not os.path.exists(tasks):
        raise SystemExit(f"profile_memory: no kernel graph dump or tracker task list under {dump_dir} "
                         "(MS_DEV_SAVE_GRAPHS / MS_ALLOC_CONF memory_tracker changed in this MindSpore?)")
    nodes, listing = max((read_kernel_graph(g) for g in graphs), key=lambda g: len(g[1]))
    order = launch_order(nodes, listing, tasks)
    return {"kernels": len(order), "need": graph_need(nodes, listing, order),
            "best_fit": best_fit_arena(nodes, listing, order), "outputs": sum(v["bytes"] for v in nodes.values())}


# ------------------------------------------------------------------------------- the child sides
def _rss() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))


def side_mf(size: str, layers: int, batch: int) -> dict:
    import train_bench as tb

    model = {**tb.SIZES[size], "num_hidden_layers": layers}
    tb.BATCH = batch
    with tempfile.TemporaryDirectory() as tmp:
        worker = tb.MfWorker(os.path.join(tmp, "init.npz"), model)
        ids, labels = tb.batch(0, model["vocab_size"])
        import numpy as np

        worker.runner.compile([{"input_ids": ids, "labels": labels, "loss_mask": np.ones(ids.shape, np.float32)}], tb.LR)
        before = _rss()
        worker.run(1)
        return {"growth": _rss() - before, "optimizer": 2 * 4 * worker.params}


def side_chain(rows: int, layers: int) -> dict:
    """Control: `layers` x (MatMul [rows, 512] x [512, 512] -> ReLU -> x 1.5), grads of the weights."""
    import mindspore as ms
    import numpy as np
    from mindspore import nn, ops

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    matmul = ops.MatMul()

    class Chain(nn.Cell):
        def __init__(self):
            super().__init__()
            rng = np.random.default_rng(0)
            self.ws = ms.ParameterTuple([ms.Parameter(ms.Tensor(rng.random((512, 512), np.float32) * 0.01), name=f"w{i}")
                                         for i in range(layers)])

        def construct(self, x):
            for w in self.ws:
                x = ops.relu(matmul(x, w)) * 1.5
            return x.sum()

    class Step(nn.Cell):
        def __init__(self, net):
            super().__init__()
            self.net, self.params = net, ms.ParameterTuple(net.trainable_params())
            self.grad = ops.GradOperation(get_by_list=True)

        def construct(self, x):
            return self.net(x), self.grad(self.net, self.params)(x)

    step = Step(Chain())
    x = ms.Tensor(np.random.default_rng(1).random((rows, 512), np.float32))
    step.compile(x)
    before = _rss()
    step(x)[0].asnumpy()
    return {"growth": _rss() - before, "optimizer": 0}


def run(label: str, argv: list[str]) -> dict | None:
    """One side in its own interpreter with the IR dump and the memory tracker on; its figures."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {"MS_DEV_SAVE_GRAPHS": "1", "MS_DEV_SAVE_GRAPHS_PATH": os.path.join(tmp, "ir"),
               "MS_ALLOC_CONF": f"memory_tracker:True,memory_tracker_path:{os.path.join(tmp, 'tracker')}"}
        result = run_side(sys.executable, [__file__, "--side", *argv], f"profile_memory: {label}", env)
        return None if result is None else {**result, **analyse(tmp)}


def row(label: str, r: dict) -> str:
    excess = r["growth"] - r["optimizer"] - r["need"]
    return (f"{label:34s} {r['kernels']:7d} {r['growth'] / MiB:8.0f} {r['optimizer'] / MiB:9.0f} {r['need'] / MiB:6.0f} "
            f"{r['best_fit'] / MiB:8.0f} {r['outputs'] / MiB:11.0f} {excess / MiB:7.0f}  {r['growth'] / max(1, r['optimizer'] + r['need']):5.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="60M", help="train_bench sweep llama (20M, 60M, 150M, 350M)")
    parser.add_argument("--layers", type=int, default=4, help="layers of that llama (fewer: a shorter dump)")
    parser.add_argument("--batches", default="1,4", help="sequences of 256 tokens per step, comma-separated")
    parser.add_argument("--no-control", action="store_true", help="skip the MatMul -> ReLU chain control")
    parser.add_argument("--side", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        kind, *rest = args.side
        result = side_mf(rest[0], int(rest[1]), int(rest[2])) if kind == "mf" else side_chain(int(rest[0]), int(rest[1]))
        print(json.dumps(result))
        return 0
    print(f"profile_memory: MiB; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'step':34s} {'kernels':>7s} {'growth':>8s} {'optimizer':>9s} {'need':>6s} {'best fit':>8s} "
          f"{'all outputs':>11s} {'excess':>7s}  growth/(optimizer+need)")
    runs = [(f"mf {args.size} x{args.layers} layers, batch {b}", ["mf", args.size, str(args.layers), b])
            for b in args.batches.split(",")]
    if not args.no_control:
        runs += [(f"control chain [{rows}, 512] x {n}", ["chain", str(rows), str(n)]) for rows, n in ((8192, 20), (1024, 80))]
    failed = 0
    for label, argv in runs:
        result = run(label, argv)
        if result is None:
            failed += 1
            continue
        print(row(label, result), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
