"""FSDP gather prefetch, the bookkeeping on one process: what is issued when, that a leaf always
receives the gather of its parameter's current value, and what `enable_gather_prefetch` refuses.
The 2-rank run with real gathers (same losses and gradients, the order of the collectives) is in
tests-integration/dist (the 2-rank launch)."""

from __future__ import annotations

import mindspore as ms
import pytest

import mf_parallel as mp
from mf_parallel.prefetch import GatherPrefetcher, GatherSource

# Three units of two gathers each, as a model's forward meets them: the root's embedding, two
# blocks, then the root's head again (a unit can come back: runs, not units, are prefetched).
FORWARD = [("emb", 0), ("b0.q", 1), ("b0.o", 1), ("b1.q", 2), ("b1.o", 2), ("head", 0)]
BACKWARD = [("b1.o", 2), ("b1.q", 2), ("b0.o", 1), ("b0.q", 1)]


class Shard:
    """A stand-in parameter whose value changes between steps (an optimizer update)."""

    def __init__(self, name: str) -> None:
        self.name, self.version = name, 0


def make():
    shards = {label: Shard(label) for label, _ in FORWARD}
    issued: list[tuple[str, str]] = []

    def issue_for(phase):
        def issue(shard):
            issued.append((phase, shard.name))
            return (shard.name, shard.version)
        return issue

    sources = {
        "forward": {label: GatherSource(label, unit, shards[label], issue_for("forward")) for label, unit in FORWARD},
        "backward": {label: GatherSource(label, unit, shards[label], issue_for("backward")) for label, unit in BACKWARD},
    }
    return GatherPrefetcher(sources, tracing=True), shards, issued


def run_pass(pf, shards, phase, order):
    for label in order:
        got = pf.take(phase, label, shards[label])
        assert got == (label, shards[label].version), f"{phase} {label}: got the gather of {got}"


def step(pf, shards):
    run_pass(pf, shards, "forward", [label for label, _ in FORWARD])
    run_pass(pf, shards, "backward", [label for label, _ in BACKWARD])
    for shard in shards.values():
        shard.version += 1


def test_first_pass_records_then_each_run_of_a_unit_prefetches_the_next():
    pf, shards, issued = make()
    step(pf, shards)
    assert pf.prefetched == 0 and all(what == "issue" or what == "use" for what, _, _ in pf.trace)
    # recording: every gather right before its use
    assert [e for e in pf.trace if e[1] == "forward"][:4] == [
        ("issue", "forward", "emb"), ("use", "forward", "emb"), ("issue", "forward", "b0.q"), ("use", "forward", "b0.q")]
    pf.trace.clear()
    step(pf, shards)
    forward = [(what, label) for what, phase, label in pf.trace if phase == "forward"]
    assert forward == [
        ("issue", "emb"), ("issue", "b0.q"), ("issue", "b0.o"), ("use", "emb"),   # block 0 before emb computes
        ("issue", "b1.q"), ("issue", "b1.o"), ("use", "b0.q"), ("use", "b0.o"),   # block 1 before block 0
        ("issue", "head"), ("use", "b1.q"), ("use", "b1.o"),                        # head before block 1
        ("use", "head"),
    ]
    backward = [(what, label) for what, phase, label in pf.trace if phase == "backward"]
    assert backward == [
        ("issue", "b1.o"), ("issue", "b1.q"),                 # block 1's run at its first use,
        ("issue", "b0.o"), ("issue", "b0.q"), ("use", "b1.o"),  # block 0's before block 1's backward
        ("use", "b1.q"), ("use", "b0.o"), ("use", "b0.q"),
    ]
    second = list(pf.trace)
    pf.trace.clear()
    step(pf, shards)
    assert pf.trace == second             # steady state
    assert pf.wasted == 0
    # every gather issued once per pass, prefetched or not: the collective count is unchanged
    per_step = len(FORWARD) + len(BACKWARD)
    assert len(issued) == 3 * per_step


def test_a_pass_that_leaves_the_order_never_hands_out_a_stale_gather():
    pf, shards, issued = make()
    step(pf, shards)
    step(pf, shards)
    # a forward that stops after block 0 (block 1 was prefetched), then an update, then a full step
    run_pass(pf, shards, "forward", ["emb", "b0.q", "b0.o"])
    for shard in shards.values():
        shard.version += 1
    step(pf, shards)                      # run_pass asserts every value is the current version
    assert pf.wasted == 2                 # block 1's two gathers were dropped, not used
    # out of order within a pass: still the right tensors
    run_pass(pf, shards, "forward", ["emb", "b1.q", "b0.q", "head", "b0.o", "b1.o"])
    run_pass(pf, shards, "backward", ["b0.q", "b1.o", "b0.o", "b1.q"])


def test_reset_drops_what_is_kept():
    pf, shards, _ = make()
    step(pf, shards)
    step(pf, shards)
    pf.take("forward", "emb", shards["emb"])       # prefetches block 0
    shards["b0.q"].version += 1                    # changed outside a step
    pf.reset()
    assert pf.take("forward", "b0.q", shards["b0.q"]) == ("b0.q", shards["b0.q"].version)


def test_enable_needs_pynative():
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        with pytest.raises(mp.ParallelConfigError, match="PyNative"):
            mp.enable_gather_prefetch(ms.nn.Dense(2, 2))
    finally:
        ms.set_context(mode=previous)


def test_one_rank_gathers_are_left_alone():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    mesh = mp.init_mesh(mp.ParallelDims(1))
    net = ms.nn.SequentialCell([ms.nn.Dense(4, 4), ms.nn.Dense(4, 2)])
    mp.fully_shard(net, mesh)
    pf = mp.enable_gather_prefetch(net)
    assert pf.sources == {"forward": {}, "backward": {}}


def test_prefetch_pays_off_in_pynative_only():
    assert mp.gather_prefetch_pays_off(ms.PYNATIVE_MODE)
    assert not mp.gather_prefetch_pays_off(ms.GRAPH_MODE)       # the compiler orders the collectives


def test_each_run_travels_as_one_bucketed_collective():
    shards = {label: Shard(label) for label, _ in FORWARD}
    single, buckets = [], []

    def issue(shard):
        single.append(shard.name)
        return (shard.name, shard.version)

    def bucket_gather(key, members):
        buckets.append((key, [m.name for m in members]))
        return [(m.name, m.version) for m in members]

    sources = {"forward": {label: GatherSource(label, unit, shards[label], issue, bucket="fp32")
                           for label, unit in FORWARD}, "backward": {}}
    pf = GatherPrefetcher(sources, bucket_gather=bucket_gather)
    for _ in range(3):
        run_pass(pf, shards, "forward", [label for label, _ in FORWARD])
        for shard in shards.values():
            shard.version += 1
    assert single[:6] == [label for label, _ in FORWARD]      # the recording pass: one by one
    # then per pass: block 0 as one collective ahead of emb, block 1 ahead of block 0 (one-gather
    # runs, emb and head, go alone: nothing to bucket)
    assert buckets == 2 * [("fp32", ["b0.q", "b0.o"]), ("fp32", ["b1.q", "b1.o"])]
    assert single.count("emb") == 3 and single.count("head") == 3 and pf.buckets == 4 and pf.wasted == 0
