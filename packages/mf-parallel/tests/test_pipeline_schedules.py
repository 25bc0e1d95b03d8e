"""Pipeline schedules as data: every schedule over a table of (p, m, v) passes the validator, and
the simulator reproduces the textbook bubbles (Huang et al. 2019 for GPipe, Narayanan et al. 2021
for 1F1B and interleaved 1F1B, Qi et al. 2023 for the split backward). Pure Python: these tests
never import MindSpore."""

from __future__ import annotations

import itertools
import subprocess
import sys
from dataclasses import replace
from fractions import Fraction

import pytest

import mf_parallel as mp
from mf_parallel.pipeline import Comm, Compute, Costs, Placement, StageLayout, textbook_bubble, validate_schedule
from mf_parallel.pipeline.schedules import zbv_bubble
from mf_parallel.pipeline.simulate import simulate

PPS = (2, 3, 4, 8)
MBS = (1, 2, 3, 4, 6, 8, 16)
COSTS = (Costs(1, 1, 1), Costs(1, 2, 1), Costs(2, 3, 1), Costs(1, 1, Fraction(1, 2)), Costs(3, 2, 2))


def _schedule(pp, m, schedule="1f1b", v=1, **flags):
    return mp.build_schedule(mp.resolve_pipeline(pp, schedule, v, **flags), m)


def _cases():
    for pp, m in itertools.product(PPS, MBS):
        yield pp, m, "gpipe", 1, False
        yield pp, m, "1f1b", 1, False
        yield pp, m, "1f1b", 1, True
        yield pp, m, "zbv", 2, True
        if m % pp == 0:
            for v in (2, 3):
                yield pp, m, "1f1b", v, False
                yield pp, m, "1f1b", v, True


@pytest.mark.parametrize("pp, m, name, v, split", list(_cases()))
def test_every_schedule_is_valid_and_its_bubble_is_the_textbook_one(pp, m, name, v, split):
    s = _schedule(pp, m, name, v, dxdw_split=split)
    peaks = validate_schedule(s)
    for costs in COSTS:
        sim = simulate(s, costs)
        F, B, W = costs.F, costs.B, costs.W
        busy = m * v * (F + B + W)
        assert all(r.busy == busy for r in sim.ranks)
        if not split:
            # (p-1)(F+B+W) idle on the busiest stage: the fraction (p-1)/(v m + p - 1)
            assert sim.bubble == (pp - 1) * (F + B + W), (costs, [r.idle for r in sim.ranks])
            assert sim.bubble_fraction == pytest.approx((pp - 1) / (v * m + pp - 1))
        elif name == "1f1b" and v == 1 and m >= pp:
            # ZB-H1: (p-1)(F+B-W), a third of 1F1B's when F = B = W (Qi et al., table 2)
            assert sim.bubble == (pp - 1) * (F + B - W), (costs, [r.idle for r in sim.ranks])
        elif name == "zbv" and F == B == W:
            assert sim.bubble == zbv_bubble(pp, m) * F, (costs, [r.idle for r in sim.ranks])
        elif name == "zbv" and m >= 2 * pp - 1:
            # never above the paper's (p-1)(T_F + T_B - 2 T_W) with a stage's T = 2 chunks' cost
            assert sim.bubble <= max(0, 2 * (pp - 1) * (F + B - 2 * W)), (costs, [r.idle for r in sim.ranks])
        if (known := textbook_bubble(s, costs)) is not None:
            assert sim.bubble == known[1], (known, costs)
    # memory: activations in flight (micro-batch x chunk), as the schedules promise
    if name == "gpipe":
        assert peaks == [m] * pp
    elif name == "1f1b" and v == 1:
        limit = [min(pp - r, m) for r in range(pp)]
        assert peaks == limit if not split else max(peaks) <= pp
    elif name == "zbv":
        # 2 pp chunks = 1F1B's p whole micro-batches (the paper's p M_B), reached once m >= 2p - 1
        assert max(peaks) <= 2 * pp and (m < 2 * pp - 1 or peaks == [2 * pp] * pp)
    assert simulate(s).peak_in_flight == peaks


@pytest.mark.parametrize("pp, m", [(2, 8), (4, 8), (4, 16), (8, 16)])
def test_split_schedules_beat_their_unsplit_twins(pp, m):
    plain = simulate(_schedule(pp, m)).bubble
    zbh1 = simulate(_schedule(pp, m, dxdw_split=True)).bubble
    zbv = simulate(_schedule(pp, m, "zbv")).bubble
    assert zbh1 == plain / 3 and zbv == 0
    inter = simulate(_schedule(pp, m, "1f1b", 2)).bubble
    inter_split = simulate(_schedule(pp, m, "1f1b", 2, dxdw_split=True)).bubble
    assert inter_split < inter


# idle time of the busiest rank at F = B = W = 1, read off the ZB-V orders by hand: zero from
# m = 2p - 1 on (Qi et al.'s ZB-V: (p-1)(T_F + T_B - 2 T_W) = 0), the V's turn showing below that
ZBV_IDLE = {
    (2, 1): 4, (2, 2): 1, (2, 3): 0, (2, 4): 0, (2, 8): 0,
    (3, 1): 8, (3, 3): 2, (3, 4): 1, (3, 5): 0, (3, 6): 0, (3, 12): 0,
    (4, 2): 9, (4, 4): 3, (4, 5): 2, (4, 6): 1, (4, 7): 0, (4, 8): 0, (4, 16): 0,
    (8, 4): 19, (8, 8): 7, (8, 12): 3, (8, 15): 0, (8, 16): 0, (8, 32): 0,
}


@pytest.mark.parametrize("pp, m", sorted(ZBV_IDLE))
def test_zbv_idle_time_is_the_formula(pp, m):
    sim = simulate(_schedule(pp, m, "zbv"))
    assert sim.bubble == ZBV_IDLE[pp, m] == zbv_bubble(pp, m)
    if m >= 2 * pp - 1:
        assert all(r.idle == 0 for r in sim.ranks)         # every rank busy through its span
    for p2p in ("blocking", "rendezvous"):                   # the comm placement never deadlocks
        assert simulate(_schedule(pp, m, "zbv"), p2p=p2p).makespan >= sim.makespan


def test_zbv_warm_up_is_the_papers():
    # p = 2, m = 4: rank 0 runs 3 forwards of chunk 0, then (F, B, W) of chunk 1 twice, then the
    # steady (F B W) pairs; rank 1 (the V's turn) alternates its chunks from the start
    s = _schedule(2, 4, "zbv")
    assert [c.label() for c in s.compute_order(0)][:9] == ["F0", "F1", "F2", "F0.1", "B0.1", "W0.1", "F1.1", "B1.1",
                                                          "W1.1"]
    assert [c.label() for c in s.compute_order(1)][:6] == ["F0", "F0.1", "F1", "F1.1", "B0.1", "W0.1"]


def test_p2p_semantics_only_add_waiting():
    s = _schedule(4, 8, "1f1b", 2)
    costs = Costs(1, 2, 1)
    a, b, r = (simulate(s, costs, mode).makespan for mode in ("async", "blocking", "rendezvous"))
    assert a <= b <= r
    with pytest.raises(mp.ParallelConfigError, match="p2p must be one of"):
        simulate(s, costs, "udp")


@pytest.mark.parametrize("pp, m", [(2, 4), (4, 8), (4, 16)])
def test_overlap_b_f_combines_pairs_without_lengthening_the_plan(pp, m):
    plain = _schedule(pp, m, "1f1b", 2)
    fused = _schedule(pp, m, "1f1b", 2, overlap_b_f=True)
    validate_schedule(fused)
    combined = [a for rank in fused.ranks for a in rank if type(a).__name__ == "Combined"]
    assert combined and all(c.forward.chunk != c.backward.chunk for c in combined)
    assert simulate(fused).bubble <= simulate(plain).bubble


@pytest.mark.parametrize("pp, m", list(itertools.product(PPS, (2, 3, 4, 8, 16))))
def test_overlap_b_f_under_1f1b_pairs_a_backward_with_the_next_forward(pp, m):
    """Plain 1F1B (MindFormers' / HyperParallel's OVERLAP_B_F): in the steady state each backward
    and the forward after it, of another micro-batch, run as one action; rank r warms up with
    2(pp - 1 - r) forwards, so every pair keeps the plan of plain 1F1B (same bubble and makespan
    under every cost and p2p semantics) at the price of min(2(pp - r) - 1, m) activations held."""
    plain, fused = _schedule(pp, m), _schedule(pp, m, overlap_b_f=True)
    peaks = validate_schedule(fused)
    pairs = [a for rank in fused.ranks for a in rank if type(a).__name__ == "Combined"]
    assert fused.combined and fused.overlap_b_f and pairs
    assert all(c.backward_first and c.backward.mb < c.forward.mb and c.label().startswith("B") for c in pairs)
    for costs in COSTS:
        for p2p in ("async", "rendezvous"):
            assert simulate(fused, costs, p2p).makespan <= simulate(plain, costs, p2p).makespan
        assert simulate(fused, costs).bubble == simulate(plain, costs).bubble
    assert peaks == [min(2 * (pp - r) - 1, m) for r in range(pp)]
    # the last stage runs F0, [B0 F1], [B1 F2], ..., B(m-1): the same computations in the same order
    last = [a.label() for a in fused.actions(pp - 1) if type(a).__name__ != "Comm"]
    assert last == ["F0", *(f"B{i}+F{i + 1}" for i in range(m - 1)), f"B{m - 1}"]
    assert fused.compute_order(pp - 1) == plain.compute_order(pp - 1)


@pytest.mark.parametrize("kwargs, m, reason", [
    (dict(pp=2, schedule="gpipe"), 4, "gpipe runs every forward before every backward"),
    (dict(pp=2, schedule="zbv"), 4, "ZB-V follows each backward by its weight gradient"),
    (dict(pp=2), 1, "1f1b with 1 micro-batch per step has no steady state"),
    (dict(pp=2, interleave_num=2), 2, "interleaved_1f1b with 2 micro-batches per step has no steady state"),
])
def test_overlap_b_f_with_nothing_to_pair_leaves_the_schedule_as_it_is(kwargs, m, reason):
    """A speed knob with nothing to act on in the layout: accepted, the schedule unchanged, and one
    reason for the executor's notice line."""
    from mf_parallel.pipeline import overlap_b_f_idle_reason

    fused = mp.build_schedule(mp.resolve_pipeline(**kwargs, overlap_b_f=True), m)
    assert fused.overlap_b_f and not fused.combined
    assert fused.ranks == mp.build_schedule(mp.resolve_pipeline(**kwargs), m).ranks
    assert reason in overlap_b_f_idle_reason(fused)


def test_schedules_are_pure_functions():
    a, b = _schedule(4, 8, "zbv"), _schedule(4, 8, "zbv")
    assert a == b and hash(a.ranks) == hash(b.ranks)


def test_one_f_one_b_order_is_megatrons():
    s = _schedule(2, 4)
    assert [a.label() for a in s.actions(0)] == [
        "F0", "r1[>a0.0]", "F1", "r1[>a1.0]", "r1[<g0.0]", "B0", "F2", "r1[>a2.0 <g1.0]", "B1", "F3",
        "r1[>a3.0 <g2.0]", "B2", "r1[<g3.0]", "B3"]
    assert [c.label() for c in s.compute_order(1)] == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]


# ----------------------------------------------------------------------------- the validator fails
def _broken(schedule, rank, edit):
    ranks = [list(r) for r in schedule.ranks]
    edit(ranks[rank])
    return replace(schedule, ranks=tuple(tuple(r) for r in ranks))


def test_validator_catches_what_would_go_wrong():
    s = _schedule(2, 4, dxdw_split=True)
    comms0 = [i for i, a in enumerate(s.actions(0)) if isinstance(a, Comm)]

    def swap_comms(actions):
        i, j = comms0[1], comms0[2]
        actions[i], actions[j] = actions[j], actions[i]

    def drop_w(actions):
        actions.remove(next(a for a in actions if isinstance(a, Compute) and a.op == "W"))

    def b_first(actions):
        i = next(i for i, a in enumerate(actions) if isinstance(a, Compute) and a.op == "B")
        actions.insert(0, actions.pop(i))

    def recv_late(actions):
        i = next(i for i, a in enumerate(actions) if isinstance(a, Comm) and a.recvs)
        actions.append(actions.pop(i))

    for rank, edit, message in ((0, swap_comms, "do not pair up|deadlock|before computing"),
                                (0, drop_w, "never runs W"),
                                (1, b_first, "before its F"),
                                (1, recv_late, "after running it|do not pair up")):
        with pytest.raises(mp.ScheduleError, match=message):
            validate_schedule(_broken(s, rank, edit))


def test_validator_finds_a_real_deadlock():
    """Both ranks first wait for the other's message: matched, but circular under blocking p2p."""
    s = _schedule(2, 2, "gpipe")

    def recv_first(actions):
        # rank 1 receives a1 before a0: its Comm order no longer mirrors rank 0's
        comms = [i for i, a in enumerate(actions) if isinstance(a, Comm)]
        actions[comms[0]], actions[comms[1]] = actions[comms[1]], actions[comms[0]]

    with pytest.raises(mp.ScheduleError):
        validate_schedule(_broken(s, 1, recv_first))


# ----------------------------------------------------------------------------- configuration
@pytest.mark.parametrize("kwargs, spec", [
    (dict(pp=2), ("1f1b", 1, False)),
    (dict(pp=2, interleave_num=2), ("interleaved_1f1b", 2, False)),
    (dict(pp=2, schedule="interleaved_1f1b", interleave_num=3), ("interleaved_1f1b", 3, False)),
    (dict(pp=2, schedule="zbv"), ("zbv", 2, True)),
    (dict(pp=2, schedule="zbv", interleave_num=2), ("zbv", 2, True)),
    (dict(pp=4, dxdw_split=True), ("1f1b", 1, True)),
    (dict(pp=4, schedule="gpipe"), ("gpipe", 1, False)),
])
def test_resolve_pipeline(kwargs, spec):
    got = mp.resolve_pipeline(**kwargs)
    assert (got.schedule, got.chunks, got.split_backward) == spec


@pytest.mark.parametrize("kwargs, message", [
    (dict(pp=2, schedule="zero_bubble"), "pipeline_parallel_schedule: must be one of gpipe, 1f1b, interleaved_1f1b, zbv"),
    (dict(pp=2, schedule="gpipe", interleave_num=2), "interleave_num: must be 1 with pipeline_parallel_schedule 'gpipe'"),
    (dict(pp=2, schedule="gpipe", dxdw_split=True), "enable_dxdw_split: gpipe runs every backward"),
    (dict(pp=2, schedule="zbv", interleave_num=3), "zbv places exactly two chunks per rank"),
    (dict(pp=2, schedule="interleaved_1f1b"), "interleaved_1f1b needs pipeline_parallel_interleave_num > 1"),
    (dict(pp=1, dxdw_split=True), "enable_dxdw_split: only acts with pipeline_parallel > 1"),
    (dict(pp=0), "pipeline_parallel: must be a positive integer"),
    (dict(pp=2, overlap_p2p="yes"), "overlap_p2p: must be true or false"),
])
def test_bad_pipeline_options_are_one_line(kwargs, message):
    with pytest.raises(mp.ParallelConfigError) as err:
        mp.resolve_pipeline(**kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_micro_batch_count_the_schedule_cannot_use_names_the_fix():
    spec = mp.resolve_pipeline(4, "1f1b", 2)
    with pytest.raises(mp.ParallelConfigError, match=r"multiple of pipeline_parallel = 4, got 6 .*one of \[4, 8, 12, 16\]"):
        mp.build_schedule(spec, 6)
    with pytest.raises(mp.ParallelConfigError, match="positive integer"):
        mp.build_schedule(mp.resolve_pipeline(2), 0)


def test_from_config_reads_the_yaml_names():
    spec = mp.pipeline_from_config({"pipeline_parallel": 4, "pipeline_parallel_interleave_num": 2,
                                    "pipeline_parallel_enable_dxdw_split": True, "pipeline_parallel_overlap_p2p": True})
    assert (spec.schedule, spec.chunks, spec.split_backward, spec.overlap_p2p) == ("interleaved_1f1b", 2, True, True)
    assert mp.pipeline_from_config(None).pp == 1


# ----------------------------------------------------------------------------- placement and layers
def test_loop_and_v_placements():
    loop = Placement(4, 2, "loop")
    assert [loop.stage(r, c) for c in range(2) for r in range(4)] == list(range(8))   # chunk c of rank r = c*pp + r
    assert loop.owner(6) == (2, 1) and (loop.first_rank, loop.last_rank) == (0, 3)
    v = Placement(4, 2, "v")
    assert [(v.stage(r, 0), v.stage(r, 1)) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert v.owner(4) == (3, 1) and (v.first_rank, v.last_rank) == (0, 0)
    with pytest.raises(mp.ParallelConfigError, match="2 chunks per rank"):
        Placement(4, 3, "v")


def test_stage_layout_of_uneven_layers_and_tied_ends():
    layout = StageLayout.build(Placement(4, 1), [[0, 1, 2], [3, 4], [5, 6], [7]])
    chunks = [layout.chunks(r)[0] for r in range(4)]
    assert [c.layers for c in chunks] == [(0, 1, 2), (3, 4), (5, 6), (7,)]
    assert chunks[0].first and chunks[3].last and not chunks[1].first and layout.tied_ranks == (0, 3)
    assert layout.describe().splitlines()[0] == "rank 0: v0 embedding + layers 0-2"
    v = StageLayout.build(mp.resolve_pipeline(2, "zbv"), [[0], [1], [2], [3]])
    assert [(c.stage, c.layers, c.first, c.last) for c in v.chunks(0)] == [(0, (0,), True, False), (3, (3,), False, True)]
    assert v.tied_ranks == (0,)
    with pytest.raises(mp.ParallelConfigError, match="virtual stage 1 must hold consecutive layers from 2"):
        StageLayout.build(Placement(2, 1), [[0, 1], [3]])
    with pytest.raises(mp.ParallelConfigError, match="virtual stage 1 holds no layer"):
        StageLayout.build(Placement(3, 1), [[0], [], [1]])
    with pytest.raises(mp.ParallelConfigError, match="4 virtual stages"):
        StageLayout.build(Placement(2, 2), [[0], [1]])


def test_costs_parse():
    assert Costs.parse("1,2,0.5") == Costs(1, 2, 0.5)
    for bad in ("1,2", "a,b,c", "1,0,1"):
        with pytest.raises(mp.ParallelConfigError, match="costs"):
            Costs.parse(bad)


def test_planning_imports_no_mindspore():
    code = ("import sys, mf_parallel as mp; s = mp.build_schedule(mp.resolve_pipeline(4, 'zbv'), 8); "
            "mp.validate_schedule(s); mp.simulate_schedule(s); mp.text_timeline(mp.simulate_schedule(s)); "
            "assert 'mindspore' not in sys.modules, sorted(m for m in sys.modules if 'mindspore' in m)[:3]")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_per_stage_costs():
    s = _schedule(4, 8)
    uniform = simulate(s, Costs(1, 2, 1))
    same = simulate(s, Costs(5, 5, 5), stage_costs={v: Costs(1, 2, 1) for v in range(4)})
    assert [r.idle for r in same.ranks] == [r.idle for r in uniform.ranks]
    # a last stage twice as slow (head + loss): the others wait for it, it never waits
    heavy = simulate(s, Costs(1, 2, 1), stage_costs={3: Costs(2, 4, 2)})
    assert heavy.ranks[3].idle == 0 and heavy.ranks[0].idle > uniform.ranks[0].idle
