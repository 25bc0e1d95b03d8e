"""Pipeline parallelism against one process: every schedule (PP2 gpipe, 1f1b, interleaved with 2
chunks, 1f1b with the dx/dw split, zbv, interleaved with split + overlap_p2p + overlap_b_f; PP4
1f1b with uneven layers per stage) on mf-models' tiny llama with tied embeddings gives the loss
and the gradient of every parameter that one process computes on the same micro-batches (fp32,
within 1e-5 relative), for two steps with an SGD update between them (so the tied table's two
copies must stay equal). One 2-rank and one 4-rank msrun launch run every case
(`_pipeline_worker.py`); each rank compares its own parameters, by global name."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent
PIPELINE_WORKER = HERE / "_pipeline_worker.py"
PIPELINE2_CASES = ("pp2_gpipe", "pp2_1f1b", "pp2_interleaved", "pp2_1f1b_split", "pp2_zbv",
                   "pp2_interleaved_split_overlap")
PIPELINE4_CASES = ("pp4_1f1b_uneven",)


def _launch(dist_run, world, cases):
    result = dist_run(PIPELINE_WORKER, world, *cases)
    if result.rc != 0 or len(result.by_name("done")) != world:
        pytest.fail(result.failure_report())
    return result


@pytest.fixture(scope="module")
def pp2(dist_run):
    return _launch(dist_run, 2, PIPELINE2_CASES)


@pytest.fixture(scope="module")
def pp4(dist_run):
    return _launch(dist_run, 4, PIPELINE4_CASES)


def _check(run, case, world):
    records = run.by_name(f"pp[{case}]")
    assert {r["rank"] for r in records} == set(range(world)), f"{case}: results from {[r['rank'] for r in records]}"
    bad = [f"rank {r['rank']}: {r['detail']}" for r in records if not r["ok"]]
    assert not bad, "\n".join(bad)
    return records


@pytest.mark.parametrize("case", PIPELINE2_CASES)
def test_pp2_schedule_matches_one_process(pp2, case):
    records = _check(pp2, case, 2)
    names = [set(r["params"]) for r in records]
    assert not (names[0] & names[1]) - {"tok_embeddings.weight"}, "a decoder parameter on both stages"
    assert {"tok_embeddings.weight", "norm.weight", "layers.0.attention.wq.weight",
            "layers.3.feed_forward.w2.weight"} <= names[0] | names[1]
    # tied embeddings: a copy on each end rank (loop placement), both ends on rank 0 for zbv
    assert [r["tied"] for r in records] == ([0, 0] if case == "pp2_zbv" else [1, 1])


def test_pp4_uneven_layers_match_one_process(pp4):
    records = _check(pp4, "pp4_1f1b_uneven", 4)
    layers = [sorted({n.split(".")[1] for n in r["params"] if n.startswith("layers.")}) for r in records]
    assert layers == [["0"], ["1", "2"], ["3", "4"], ["5"]]          # layers_per_stage [1, 2, 2, 1]
    assert [r["tied"] for r in records] == [1, 0, 0, 1]


def test_overlap_flags_say_what_they_cannot_do_on_cpu(pp2):
    records = pp2.by_name("pp_flags_logged")
    assert len(records) == 2 and all(r["ok"] for r in records), [r["detail"] for r in records]


def test_timings_are_reported(pp2, pp4):
    """Step time per schedule against one process, measured idle time against the simulator's
    (read by the benchmark notes; no timing assertions)."""
    for run, cases in ((pp2, PIPELINE2_CASES), (pp4, PIPELINE4_CASES)):
        for case in cases:
            timings = run.by_name(f"pp_time[{case}]")
            assert len(timings) == len({t["rank"] for t in timings}) > 1
            assert all(t["step_seconds"] > 0 and set(t["sim_idle"]) == {"async", "rendezvous"} for t in timings)
