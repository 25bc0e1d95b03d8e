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
router groups, 2 chosen), routing drawn from the model above; a counting wrapper in front of each
level's token all-to-all counts the non-zero rows each rank sends to another device group (and,
for deredundancy's level 2, to another rank of its group). They must equal
`mf_parallel.routed_rows` of the same routing exactly (else exit 1), and their mean per token is
printed beside the analytic expectation (sampling noise only). The counter's payload of one
forward is checked against the static buffer sizes (P T k H for alltoall; M T H + M T k and
G M T k H for deredundancy, float32).

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
def worker() -> None:
    import mindspore as ms
    from mindspore import Tensor, nn

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

    class RowCounter(nn.Cell):
        """In front of an all-to-all: counts the non-zero rows of the slots `remote` selects."""

        def __init__(self, inner, remote):
            super().__init__()
            self.inner, self.remote, self.rows = inner, remote, 0

        def construct(self, buf):
            rows = np.abs(buf.asnumpy()).reshape(buf.shape[0], buf.shape[1], -1).max(2) > 0
            self.rows += int(rows[self.remote].sum())
            return self.inner(buf)

    local = LocalDispatcher(c["experts"] // c["ep"] + 1, 1)
    a2a = mp.AllToAllTokenDispatcher(mesh["ep"], c["experts"], c["top_k"], local)
    within, across = mp.two_level_groups(mesh, g)
    der = mp.DeredundancyTokenDispatcher(within, across, c["experts"], c["top_k"], local)
    counters = {
        "alltoall_across": (a2a.exchange, [s // g != rank // g for s in range(c["ep"])]),
        "deredundancy_across": (der.across_tokens, [s != rank // g for s in range(across.size)]),
        "deredundancy_within": (der.within_tokens, [s != rank % g for s in range(within.size)]),
    }
    for exchange, remote in counters.values():
        exchange.forward_a2a = RowCounter(exchange.forward_a2a, remote)
    payload = {}
    for name, d in (("alltoall", a2a), ("deredundancy", der)):
        mp.comm_stats().reset()
        rows, _, handle, _, _ = d.dispatch(x, Tensor(idx))
        d.combine(rows, handle, w).asnumpy()          # the experts as the identity: bytes only
        payload[name] = mp.comm_stats().payload_by_kind().get("all_to_all", 0)
    measured = {key: exchange.forward_a2a.rows for key, (exchange, _) in counters.items()}
    exact = mp.routed_rows(idx, c["experts"], c["ep"], g, rank)
    print("BENCH " + json.dumps({"rank": rank, "measured": measured, "exact": exact, "payload": payload}), flush=True)


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
    measured = {k: sum(r["measured"][k] for r in results) for k in results[0]["measured"]}
    exact = {k: sum(r["exact"][k] for r in results) for k in measured}
    mismatches = sum(measured[k] != exact[k] for k in measured)
    for key in measured:
        print(f"tiny {key} rows (4 ranks, {tokens} tokens): measured {measured[key]}, routed_rows {exact[key]}")
    a2a, der = expected_rows_across(c["experts"], c["top_k"], c["n_group"], c["topk_group"], c["ep"], c["group_size"])
    print(f"tiny rows across device groups per token (measured / analytic): ours {measured['deredundancy_across'] / tokens:.3f}"
          f" / {der:.3f}, reference {measured['alltoall_across'] / tokens:.3f} / {a2a:.3f}, ratio "
          f"{measured['deredundancy_across'] / measured['alltoall_across']:.3f} / {der / a2a:.3f}")
    m, g, t, k, h = c["ep"] // c["group_size"], c["group_size"], c["tokens"], c["top_k"], c["hidden"]
    static = {"alltoall": 2 * c["ep"] * t * k * h * 4, "deredundancy": (2 * m * t * h + m * t * k + 2 * g * m * t * k * h) * 4}
    for r in results:
        for name in static:
            mismatches += r["payload"][name] != static[name]
    print(f"tiny static all-to-all payload per rank, one forward (measured = analytic: {mismatches == 0}): ours "
          f"{results[0]['payload']['deredundancy']} B, reference {results[0]['payload']['alltoall']} B, ratio "
          f"{results[0]['payload']['deredundancy'] / results[0]['payload']['alltoall']:.3f} (of which across device "
          f"groups: ours {(m - 1) * t * (2 * h + k) * 4} B, reference {(m - 1) * g * t * k * h * 4 * 2} B)")
    return 1 if mismatches or len(results) != c["ep"] else 0


if __name__ == "__main__":
    if os.environ.get("MF_BENCH_WORKER"):
        worker()
    else:
        sys.exit(main())
