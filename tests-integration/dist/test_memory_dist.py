"""mf_trainer.memory_plan against the measured peak on 2 CPU ranks: FSDP2 and TP2 (with SP).

The worker and the tolerance are tests-integration/memory's (see test_memory_plan.py there): each
rank's peak RSS minus the `idle2` launch's peak of the same rank (the minuscule model on 2
ranks: the framework and the communication runtime), against the estimate; parameter and
optimizer bytes exactly what each rank's Trainer holds.

Measured on this machine (MiB per rank, estimate / measured): FSDP2 466 / 543 (0.86), within the
one-process 25%; TP2 254 / 403 (0.63); before mf-models 0.9.0's explicit broadcasts and the
plan's new transient term, 556 / 600 and 300 / 447. Under tensor parallelism the estimate misses about 150 MiB
that no tensor of the model accounts for: the collectives' own buffers on CPU (mf-parallel
emulates reduce-scatter with a full-size all-reduce, and custom-bprop Cells keep their inputs and
outputs for backward) are not modelled yet, so TP2 is held to 40% and this gap is stated, not
hidden.

`tp2_rcomm` is TP2 with recompute_comm on both gathers of every layer (8 re-gathered inputs of
8 x 128 -> 256 tokens x hidden 256). Measured here: 376 MiB against TP2's 403 (rank 0; rank 1
alike), 27.5 MiB saved (28.3 before 0.9.0), against 6.0 MiB estimated (8 MiB fewer kept activations, 2 MiB more
rebuilt in backward): the estimate counts the one tensor recompute_comm stops keeping (the
full-sequence input, less the shard the norm leaves), while PyNative's custom-bprop gather kept
about 1.75 full inputs per gather (part of the TP gap above). So the test holds the estimate to
TP2's tolerance, checks that the saving is real on every rank, and that the estimated saving is
not more than the measured one (a lower bound, like the estimate of TP2 itself).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

MEMORY = Path(__file__).resolve().parent.parent / "memory"
WORKER = MEMORY / "_memory_worker.py"
RTOL = {"fsdp2": 0.25, "tp2": 0.40, "tp2_rcomm": 0.40}


@pytest.fixture(scope="module")
def memory_runs(dist_run, scratch):
    sys.path.insert(0, str(MEMORY))
    from _memory_worker import write_corpus

    workdir = scratch / "memory"
    write_corpus(str(workdir / "data" / "toy_text_document"))
    out = {}
    for case in ("idle2", "fsdp2", "tp2", "tp2_rcomm"):
        result = dist_run(WORKER, 2, str(workdir), case, env={"GLOG_v": "3"})
        if result.rc != 0:
            pytest.fail(result.failure_report())
        out[case] = [json.loads((workdir / case / f"rank_{r}.json").read_text()) for r in range(2)]
    return out


@pytest.mark.parametrize("case", ["fsdp2", "tp2", "tp2_rcomm"])
def test_estimate_is_within_tolerance_on_every_rank(memory_runs, case):
    for rank, (run, idle) in enumerate(zip(memory_runs[case], memory_runs["idle2"])):
        measured = run["peak"] - idle["peak"]
        assert abs(run["estimate"] / measured - 1) <= RTOL[case], (case, rank, run["estimate"] >> 20, measured >> 20)
        assert run["parts"]["parameters"] == run["held"]["parameters"]
        assert run["parts"]["optimizer"] == run["held"]["optimizer"]


def test_recompute_comm_saves_at_least_the_estimate_on_every_rank(memory_runs):
    for rank, (plain, comm) in enumerate(zip(memory_runs["tp2"], memory_runs["tp2_rcomm"])):
        measured, estimated = plain["peak"] - comm["peak"], plain["estimate"] - comm["estimate"]
        assert estimated > 0 and comm["parts"]["activations"] < plain["parts"]["activations"], (rank, estimated)
        assert measured >= estimated, (rank, measured >> 20, estimated >> 20)
