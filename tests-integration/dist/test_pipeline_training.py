"""Pipeline-parallel training with the real Trainer against one process (TorchTitan loss-compare
style): the tiny llama with tied embeddings (4 layers; 6 for PP4), 4 steps of the same global batch
(4 micro-batches of 1 sample under PP, one batch of 4 in one process), per-step loss and gradient
norm within 1e-5 relative, and the final gathered weights: PP2 1f1b, gpipe, interleaved (2 chunks),
1f1b with the dx/dw split, zbv, PP4 1f1b with uneven pipeline_parallel_layers_per_stage, and on
4 ranks PP2 x FSDP2 (each stage sharded over its data-parallel pair, 2 micro-batches per slice),
PP2 x DDP2 (each stage whole on both ranks of its pair, its gradients all-reduced over the pair)
and PP2 x TP2 (the stages' layers under the TP plan, vocabulary-split logits and loss on the last
stage, the tied table's copies still summed between the two ends) under 1f1b, and under the other
schedules: gpipe x TP2, interleaved (2 chunks, each with its own FSDP units) with the dx/dw split
x FSDP2 (deferred weight gradients reduce-scattered when W runs), zbv x FSDP2 and x TP2 (the V
placement, split backward: embedding, head, loss and both uses of the tied table on rank 0).
Evaluation during training under PP2 1f1b, PP2 x FSDP2 and PP2 x TP2 against one process.
Checkpoints: a PP2 and a PP2 x TP2 checkpoint continue in one process, and a one-process checkpoint
under PP2 and under PP2 x TP2, with the losses of the one-process run resumed from its own
checkpoint (so a checkpoint moves PP2 -> one process -> PP2 x TP2 and back unchanged).

The cases run in the shared launches of conftest.py (world 2 and world 4, after the other Trainer
cases) plus one one-process continuation; step times go to the RESULT summary (`-s` prints them).
"""

from __future__ import annotations

import numpy as np
import pytest
from _case_results import case_result as _result
from _case_results import assert_same_evaluations
from _case_results import case_weights as _weights
from _case_results import check_param_norms
from _case_results import rel_err as _rel
from _launches import DEMO_PIPELINE_CASES, PIPELINE2_CASES, PIPELINE4_CASES, run_one_process
from _trainer_worker import CASES, DEMO_STEPS, LR, MAX_NORM, MORE, STEPS

RTOL = 1e-5
# As in test_trainer_parity.py: the key bias's gradient is almost only rounding (see there).
KEY_BIAS_ATOL = 1e-3 * LR
TRAINED = [c for c in (*PIPELINE2_CASES, *PIPELINE4_CASES) if "_from_" not in c]




def _reference_of(case: str) -> str:
    return "reference6" if case.startswith("pp4") else "reference4"


@pytest.fixture(scope="module")
def runs(reference, world2, world4):
    return reference


@pytest.fixture(scope="module")
def pp2_to_one_process(runs):
    """PP2 1f1b's and PP2 x TP2's checkpoints continued by one process (one start-up)."""
    proc = run_one_process(runs, "reference4_from_pp2_1f1b", "reference4_from_pp2_tp2")
    if proc.returncode != 0:
        pytest.fail(f"one-process continuation failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return _result(runs, "reference4_from_pp2_1f1b")


@pytest.mark.parametrize("case", TRAINED)
def test_pipeline_parity_with_one_process(runs, case):
    ref, got = _result(runs, _reference_of(case)), _result(runs, case)
    assert len(got["losses"]) == STEPS and "pp=" in got["dims"] and got["mode"] == 1      # PyNative
    assert sum(n > MAX_NORM for n in ref["grad_norms"]) > 0                               # clipping takes part
    loss_err, norm_err = _rel(got["losses"], ref["losses"]), _rel(got["grad_norms"], ref["grad_norms"])
    assert loss_err <= RTOL, f"{case}: losses {got['losses']} vs {ref['losses']} (rel err {loss_err:.2e})"
    assert norm_err <= RTOL, f"{case}: grad norms {got['grad_norms']} vs {ref['grad_norms']} ({norm_err:.2e})"
    check_param_norms(ref, got, RTOL)
    want, have = _weights(runs, _reference_of(case)), _weights(runs, case)
    # The global layout: every name once, the tied table once, no stage-local names.
    assert set(have) == set(want) and "tok_embeddings.weight" in have and "output.weight" not in have
    for name in want:
        atol = KEY_BIAS_ATOL if name.endswith("attention.wk.bias") else 1e-6
        np.testing.assert_allclose(have[name], want[name], rtol=RTOL, atol=atol, err_msg=f"{case}: {name}")
    print(f"\n{case} ({got['pipeline']['schedule']}): median step {np.median(got['step_times'][1:]):.2f} s on "
          f"{CASES[case][3]} ranks vs {np.median(ref['step_times'][1:]):.2f} s in one process; last step: compute "
          f"{got['pipeline']['compute']:.2f} s, p2p {got['pipeline']['comm']:.2f} s, idle {got['pipeline']['idle']:.2f} s")


def test_evaluation_during_training_matches_one_process(runs, world2):
    """eval_dataset under PP2 1f1b (forward only through the stages, the sums from the last stage
    shared with both ranks; 8 batches of 1 sample): one process's eval loss and accuracy (2 batches
    of 4, the same 8 samples) at the same steps."""
    assert_same_evaluations(_result(runs, "pp2_1f1b"), _result(runs, "reference4"))


@pytest.mark.parametrize("case", ["pp2_fsdp2", "pp2_tp2"])
def test_evaluation_with_sharded_stages_matches_one_process(runs, world4, case):
    """eval_dataset with FSDP stages (each data-parallel slice evaluates its share, the stages
    gathering their shards in the forward) and with TP stages (vocabulary-split logits on the last
    stage): one process's eval loss and accuracy at the same steps."""
    assert_same_evaluations(_result(runs, case), _result(runs, "reference4"))


def test_interleaved_asked_for_graph_mode_and_says_why_it_runs_pynative(runs, world2):
    assert CASES["pp2_interleaved"][2] == 0 and _result(runs, "pp2_interleaved")["mode"] == 1
    assert "the pipeline executor differentiates each micro-batch" in world2.logs[0]


@pytest.mark.parametrize("source", ["reference4_from_pp2_1f1b", "pp2_1f1b_from_reference4", "reference4_from_pp2_tp2",
                                    "pp2_tp2_from_reference4"])
def test_checkpoints_continue_between_pipeline_layouts_and_one_process(runs, pp2_to_one_process, source):
    want = _result(runs, "reference4")["continued"]
    got = _result(runs, source)
    assert got["start_step"] == STEPS and len(got["losses"]) == MORE == len(want)
    assert _rel(got["losses"], want) <= RTOL, f"{source}: {got['losses']} vs {want}"



@pytest.mark.parametrize("case", DEMO_PIPELINE_CASES)
def test_readme_demo_under_every_schedule_matches_one_process(runs, world2, case):
    """The README's pipeline command on the demo itself (examples/tiny/train.yaml, the 2M llama with
    tied embeddings and its held-out evaluation), under each schedule: one process's losses, grad
    norms, evaluation and final weights."""
    ref, got = _result(runs, "demo_reference"), _result(runs, case)
    assert len(got["losses"]) == DEMO_STEPS == len(ref["losses"]) and "pp=2" in got["dims"]
    loss_err, norm_err = _rel(got["losses"], ref["losses"]), _rel(got["grad_norms"], ref["grad_norms"])
    print(f"\n{case} ({got['pipeline']['schedule']}): losses rel err {loss_err:.1e}, grad norms {norm_err:.1e}; "
          f"median step {np.median(got['step_times'][1:]):.2f} s vs {np.median(ref['step_times'][1:]):.2f} s")
    assert loss_err <= RTOL, f"{case}: losses {got['losses']} vs {ref['losses']}"
    assert norm_err <= RTOL, f"{case}: grad norms {got['grad_norms']} vs {ref['grad_norms']}"
    # the demo's eval_dataset (interval 100): evaluated once, at the last step, as one process
    assert [e["step"] for e in got["evaluations"]] == [e["step"] for e in ref["evaluations"]] == [DEMO_STEPS]
    err = _rel([got["evaluations"][0]["eval_loss"]], [ref["evaluations"][0]["eval_loss"]])
    assert err <= RTOL, (got["evaluations"], ref["evaluations"])
    want, have = _weights(runs, "demo_reference"), _weights(runs, case)
    assert set(have) == set(want)
    for name in want:
        np.testing.assert_allclose(have[name], want[name], rtol=RTOL, atol=1e-6, err_msg=f"{case}: {name}")
