"""mf-parallel's expert-parallel dispatchers: rows and bytes moved across device groups,
`alltoall` against `alltoall_deredundancy`, analytic and measured.

    python benchmarks/moe_dispatch_bench.py       # analytic table, then a tiny run on 4 CPU ranks

Routing model (the analytic figures): DeepSeek-V3's group-limited top-k with exchangeable scores:
topk_group of the n_group router groups chosen uniformly, then top_k experts uniformly among the
chosen groups' experts. The ep ranks form device groups of npu_nums_per_device ranks (M = ep / G
groups, each holding E / M consecutive experts). Per token and direction, across device groups:
  alltoall        one row per assignment whose expert lives in another device group
  deredundancy    one row per other device group holding any of the token's experts
so the expectations are sum over the other groups of E[k a / A] and P(a hit) = 1 - C(A - a, k) /
C(A, k) (A allowed experts, a of them in that group), averaged over the chosen router groups.
Bytes: rows x hidden x 2 (bf16 tokens on Ascend).

Measured: the real dispatchers on 4 CPU ranks (ep 4, device groups of 2; 16 experts top-4 in 4
router groups, 2 chosen), routing drawn from the model above, PyNative (the counts-first,
variable-size exchange): one forward + backward of dispatch -> (experts as the identity) ->
combine per dispatcher, and the bytes `comm_stats` counted - `all_to_all_v` (the rows sent to
other ranks) and `all_to_all` (the counts) - against the analytic bytes of the same routing
(`mf_parallel.routed_rows` summed over the ranks: alltoall 4 H x 4 per remote row; deredundancy
(4 H + 3 k) x 4 per row across device groups and 4 H x 4 per row within; the counts (P - 1) E/P,
resp. (M - 1) + (G - 1) E/P int32 per rank). They must be equal (else exit 1). The rows across device groups per
token are printed beside the analytic expectation (sampling noise only), and the step time of
each dispatcher (median of 5, after one warm-up).

Output lines: `name: ours X, reference Y, ratio Z` (ours = deredundancy, reference = alltoall).
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import tempfile
from math import comb
from pathlib import Path

import numpy as np

# (name, experts, top_k, n_group, topk_group, ep, npu_nums_per_device, hidden)
REALISTIC = [("deepseek_v3 ep16/8", 256, 8, 8, 4, 16, 8, 7168), ("deepseek_v3 ep8/2", 256, 8, 8, 4, 8, 2, 7168),
             ("deepseek_v3 ep64/8", 256, 8, 8, 4, 64, 8, 7168)]
TINY = dict(experts=16, top_k=4, n_group=4, topk_group=2, ep=4, group_size=2, hidden=16, tokens=256)
BF16 = 2


def expected_rows_across(experts, top_k, n_group, topk_group, ep, group_size) -> tuple[float, float]:
    """(alltoall, deredundancy) expected rows per token sent to other device groups."""
    m = ep // group_size
    per_router, per_device = experts // n_group, experts // m
    router_groups = [set(range(r * per_router, (r + 1) * per_router)) for r in range(n_group)]
    device_groups = [set(range(g * per_device, (g + 1) * per_device)) for g in range(m)]
    a2a = der = 0.0
    chosen_sets = list(itertools.combinations(range(n_group), topk_group))
    for chosen in chosen_sets:
        allowed = set().union(*(router_groups[r] for r in chosen))
        total = len(allowed)
        for source in range(m):
            for g in range(m):
                if g == source:
                    continue
                a = len(allowed & device_groups[g])
                a2a += top_k * a / total
                der += 1 - comb(total - a, top_k) / comb(total, top_k)
    n = len(chosen_sets) * m
    return a2a / n, der / n


def sample_routing(rng, tokens, experts, top_k, n_group, topk_group) -> np.ndarray:
    per_router = experts // n_group
    idx = np.empty((tokens, top_k), np.int32)
    for t in range(tokens):
        chosen = rng.choice(n_group, topk_group, replace=False)
        allowed = (chosen[:, None] * per_router + np.arange(per_router)).ravel()
        idx[t] = rng.choice(allowed, top_k, replace=False)
    return idx


# ----------------------------------------------------------------------------- the 4-rank run
def analytic_bytes(rows: dict, c: dict) -> dict:
    """Bytes one forward + backward sends to other ranks, all ranks together, from the routed rows
    summed over the ranks (float32). (Per rank the rows a rank receives count too: it sends them
    back in combine, and their gradient in backward; summed over ranks, received = sent.)"""
    h, k, ep, g = c["hidden"], c["top_k"], c["ep"], c["group_size"]
    le = c["experts"] // ep
    return {"alltoall": {"rows": rows["alltoall_remote"] * 4 * h * 4, "counts": (ep - 1) * le * 4},
            "deredundancy": {"rows": rows["deredundancy_across"] * (4 * h + 3 * k) * 4
                             + rows["deredundancy_within"] * 4 * h * 4,
                             "counts": (ep // g - 1) * 4 + (g - 1) * le * 4}}


def worker() -> None:
    import time

    import mindspore as ms
    from mindspore import Tensor

    import mf_parallel as mp
    from mf_models.common.dispatch import LocalDispatcher

    ms.set_context(mode=ms.PYNATIVE_MODE)
    c = TINY
    mesh = mp.init_mesh(mp.ParallelDims(c["ep"], ep=c["ep"]))
    rank, g = mesh.rank, c["group_size"]
    rng = np.random.default_rng(100 + rank)
    idx = sample_routing(rng, c["tokens"], c["experts"], c["top_k"], c["n_group"], c["topk_group"])
    x = Tensor(rng.normal(size=(c["tokens"], c["hidden"])).astype(np.float32))
    w = Tensor(rng.uniform(0.1, 1, (c["tokens"], c["top_k"])).astype(np.float32))
    probe = Tensor(rng.normal(size=(c["tokens"], c["hidden"])).astype(np.float32))

    local = LocalDispatcher(c["experts"] // c["ep"] + 1, 1)
    within, across = mp.two_level_groups(mesh, g)
    dispatchers = {"alltoall": mp.AllToAllTokenDispatcher(mesh["ep"], c["experts"], c["top_k"], local),
                   "deredundancy": mp.DeredundancyTokenDispatcher(within, across, c["experts"], c["top_k"], local)}
    measured, seconds = {}, {}
    for name, d in dispatchers.items():
        def step(x, w, d=d):
            rows, _, handle, _, _ = d.dispatch(x, Tensor(idx))
            return (d.combine(rows, handle, w) * probe).sum()      # the experts as the identity: bytes only

        grad = ms.grad(step, grad_position=(0, 1))
        times = []
        for _ in range(6):
            mp.barrier(mesh["ep"])
            mp.comm_stats().reset()
            start = time.perf_counter()
            [t.asnumpy() for t in grad(x, w)]
            times.append(time.perf_counter() - start)
        snap = mp.comm_stats().snapshot()
        measured[name] = {"rows": snap.get("all_to_all_v/emulated", {}).get("payload_bytes", 0),
                          "counts": snap.get("all_to_all/emulated", {}).get("payload_bytes", 0)}
        seconds[name] = float(np.median(times[1:]))
    exact = mp.routed_rows(idx, c["experts"], c["ep"], g, rank)
    print("BENCH " + json.dumps({"rank": rank, "measured": measured, "rows": exact, "seconds": seconds}), flush=True)


def main() -> int:
    import mf_parallel as mp

    for name, e, k, ng, tg, ep, g, h in REALISTIC:
        a2a, der = expected_rows_across(e, k, ng, tg, ep, g)
        print(f"{name} (E {e} top-{k}, {tg} of {ng} router groups, {ep // g} device groups of {g}) bytes across "
              f"device groups per token and direction (analytic, bf16, H {h}): ours {der * h * BF16:.0f}, "
              f"reference {a2a * h * BF16:.0f}, ratio {der / a2a:.3f} ({der:.2f} vs {a2a:.2f} rows)")
    with tempfile.TemporaryDirectory() as tmp:
        rc = mp.launch(TINY["ep"], [__file__], Path(tmp) / "logs", env={**os.environ, "MF_BENCH_WORKER": "1"},
                       console=open(os.devnull, "w"), cwd=tmp)
        logs = [(Path(tmp) / "logs" / f"worker_{r}.log").read_text(errors="replace") for r in range(TINY["ep"])]
    if rc != 0:
        print(logs[0][-3000:])
        return rc
    results = [json.loads(line.split("BENCH ", 1)[1]) for log in logs for line in log.splitlines() if "BENCH " in line]
    c = TINY
    tokens = c["tokens"] * c["ep"]
    rows = {key: sum(r["rows"][key] for r in results) for key in results[0]["rows"]}
    analytic = analytic_bytes(rows, c)
    mismatches = 0
    for name in ("alltoall", "deredundancy"):
        for part in ("rows", "counts"):
            got = sum(r["measured"][name][part] for r in results)
            want = analytic[name][part] * (c["ep"] if part == "counts" else 1)
            mismatches += got != want
            print(f"tiny {name} {part} bytes, one forward + backward, 4 ranks together: measured {got}, "
                  f"analytic {want}")
        print(f"tiny {name} step time (dispatch + combine, fwd + bwd, median, slowest rank): "
              f"{max(r['seconds'][name] for r in results) * 1e3:.1f} ms")
    a2a, der = expected_rows_across(c["experts"], c["top_k"], c["n_group"], c["topk_group"], c["ep"], c["group_size"])
    print(f"tiny rows across device groups per token (routed / analytic): ours {rows['deredundancy_across'] / tokens:.3f}"
          f" / {der:.3f}, reference {rows['alltoall_across'] / tokens:.3f} / {a2a:.3f}, ratio "
          f"{rows['deredundancy_across'] / rows['alltoall_across']:.3f} / {der / a2a:.3f}")
    h, k = c["hidden"], c["top_k"]
    print(f"tiny bytes across device groups, one forward + backward (from the routed rows): ours "
          f"{rows['deredundancy_across'] * (4 * h + 3 * k) * 4}, reference {rows['alltoall_across'] * 4 * h * 4}")
    return 1 if mismatches or len(results) != c["ep"] else 0


if __name__ == "__main__":
    if os.environ.get("MF_BENCH_WORKER"):
        worker()
    else:
        sys.exit(main())
