"""FSDP gather prefetch on 2 CPU ranks (the end of the 2-rank launch): the tiny llama under FSDP2
with reshard-after-forward, trained 3 steps (plain SGD on the gathered gradients) with and without
`enable_gather_prefetch`, from the same weights on the same batches.

Checks, one RESULT line each per rank:
- prefetch[same_training]: losses and every gradient bit for bit equal with and without (a gather
  kept across an update would change them), and no prefetched gather was wasted;
- prefetch[collectives]: the same bytes per step for every kind of collective, the same calls but
  for the all-gathers, which travel one per unit run (bucketed) instead of one per parameter;
- prefetch[order]: in the last step, forward and backward, every unit run's gathers were issued
  before the unit run before it computed (its first leaf received its parameter);
- prefetch[scatter_buckets]: with the reduce-scatters bucketed per unit too
  (`enable_gradient_buckets`, the step adding the bucketed shards), losses and every gradient bit
  for bit those without, the same bytes, one reduce-scatter per unit instead of one per parameter.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from _results import emit, run_check
from mindspore import Tensor, nn, ops

import mf_models
import mf_parallel as mp

STEPS, BATCH, SEQ, LR = 3, 2, 16, 0.05


class LossCell(nn.Cell):
    def __init__(self, model):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, ids, labels):
        logits = self.model(ids).astype(ms.float32)
        log_probs = ops.LogSoftmax(-1)(logits)
        return -ops.gather_elements(log_probs, -1, labels.expand_dims(-1)).mean()


def batches(rank: int):
    rng = np.random.default_rng(100 + rank)
    for _ in range(STEPS):
        text = rng.integers(2, 64, (BATCH, SEQ + 1)).astype(np.int32)
        yield Tensor(text[:, :-1]), Tensor(text[:, 1:])


def train(mesh, prefetch: bool, buckets: bool = False):
    """(losses, gradients of every step, comm snapshot per step, the prefetcher or None)."""
    section = mf_models.tiny_model_section("llama", tie_word_embeddings=True)
    model = mf_models.build_model(section, seed=11)
    layout = mp.Layout.for_dims(mesh.dims, {"reshard_after_forward_policy": "always"})
    mf_models.parallelize_model(model, mesh, mf_models.ParallelOptions(layout))
    prefetcher = mp.enable_gather_prefetch(model, tracing=True) if prefetch else None
    params = model.trainable_params()
    bucketed = mp.enable_gradient_buckets(model).cell(params) if buckets else None
    value_and_grad = ms.value_and_grad(LossCell(model), None, params)

    def grad_fn(ids, labels):
        loss, grads = value_and_grad(ids, labels)
        return loss, (bucketed(grads) if bucketed is not None else grads)

    losses, grads_per_step, comms = [], [], []
    for ids, labels in batches(mesh.rank):
        if prefetcher is not None:
            prefetcher.trace.clear()
        mp.comm_stats().reset()
        loss, grads = grad_fn(ids, labels)
        comms.append(mp.comm_stats().snapshot())
        losses.append(float(loss.asnumpy()))
        grads_per_step.append([g.asnumpy().copy() for g in grads])
        for p, g in zip(params, grads):
            p.set_data(p - LR * g)
    return losses, grads_per_step, comms, prefetcher


def _bits_differ(run_a, run_b) -> str | None:
    """Where two runs' losses or per-step gradients differ in any bit, else None."""
    (l0, g0, _, _), (l1, g1, _, _) = run_a, run_b
    if l0 != l1:
        return f"losses differ: {l0} vs {l1}"
    for step, (a, b) in enumerate(zip(g0, g1)):
        for i, (x, y) in enumerate(zip(a, b)):
            if not np.array_equal(x, y):
                return f"step {step} gradient {i}: max diff {np.abs(x - y).max()}"
    return None


def check_same(plain, pre):
    pf = pre[3]
    differ = _bits_differ(plain, pre)
    if differ:
        return False, differ
    if pf.wasted:
        return False, f"{pf.wasted} prefetched gathers were wasted"
    return True, f"losses {pre[0]}; {pf.prefetched} gathers prefetched over {STEPS} steps, none wasted"


def check_collectives(plain, pre):
    pf = pre[3]
    for step, (a, b) in enumerate(zip(plain[2], pre[2])):
        if sorted(a) != sorted(b):
            return False, f"step {step}: kinds without {sorted(a)} / with {sorted(b)}"
        for kind in a:
            same = ("payload_bytes",) if kind.startswith("all_gather") else ("payload_bytes", "calls")
            for field in same:
                if a[kind][field] != b[kind][field]:
                    return False, f"step {step} {kind} {field}: without {a[kind][field]} / with {b[kind][field]}"
    gathers = [k for k in pre[2][-1] if k.startswith("all_gather")]
    fewer = all(pre[2][-1][k]["calls"] < plain[2][-1][k]["calls"] for k in gathers)
    calls = ", ".join(f"{k} {plain[2][-1][k]['calls']} -> {pre[2][-1][k]['calls']} calls" for k in gathers)
    return fewer and pf.buckets > 0, f"last step: {calls}; {pf.buckets} bucketed gathers in all"


def runs_in_order(trace, phase, pf):
    """Problems with `phase` of the trace: a unit run whose gathers were not all issued before the
    previous run's first leaf received its parameter."""
    groups = pf.phases[phase].groups
    events = [(what, label) for what, p, label in trace if p == phase]
    first_use = {label: i for i, (what, label) in reversed(list(enumerate(events))) if what == "use"}
    issued = {}
    for i, (what, label) in enumerate(events):
        if what == "issue":
            issued.setdefault(label, i)
    problems = []
    for g in range(1, len(groups)):
        before = first_use[groups[g - 1][0]]
        late = [label for label in groups[g] if issued[label] > before]
        if late:
            problems.append(f"{phase}: {late} issued after {groups[g - 1][0]} computed")
    return problems, len(groups)


def check_order(pre):
    pf = pre[3]
    problems, shapes = [], []
    for phase in ("forward", "backward"):
        found, runs = runs_in_order(pf.trace, phase, pf)
        problems += found
        shapes.append(f"{phase} {runs} unit runs")
        if runs < 3:
            problems.append(f"{phase}: only {runs} unit runs recorded")
    return not problems, "; ".join(problems) or ", ".join(shapes) + ", each gathered before the one before computed"


def check_scatter_buckets(pre, both):
    c0, c1 = pre[2], both[2]
    differ = _bits_differ(pre, both)
    if differ:
        return False, differ
    before, after = c0[-1], c1[-1]
    if sorted(before) != sorted(after):
        return False, f"kinds without {sorted(before)} / with {sorted(after)}"
    for kind in before:
        if before[kind]["payload_bytes"] != after[kind]["payload_bytes"]:
            return False, f"{kind} payload: without {before[kind]['payload_bytes']} / with {after[kind]['payload_bytes']}"
    scatters = [k for k in before if k.startswith("reduce_scatter")]
    calls = ", ".join(f"{k} {before[k]['calls']} -> {after[k]['calls']} calls" for k in scatters)
    fewer = bool(scatters) and all(after[k]["calls"] < before[k]["calls"] for k in scatters)
    return fewer, f"last step: {calls}; losses {both[0]}"


def main():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    mesh = mp.init_mesh(mp.ParallelDims(2, dp_shard=2))
    plain = train(mesh, prefetch=False)
    pre = train(mesh, prefetch=True)
    both = train(mesh, prefetch=True, buckets=True)
    run_check("prefetch[same_training]", check_same, plain, pre)
    run_check("prefetch[collectives]", check_collectives, plain, pre)
    run_check("prefetch[order]", check_order, pre)
    run_check("prefetch[scatter_buckets]", check_scatter_buckets, pre, both)
    emit("prefetch_done", True)
