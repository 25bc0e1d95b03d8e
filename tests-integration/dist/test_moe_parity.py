"""MoE training parity: a tiny DeepSeek-V3 (MLA, first layer dense, a shared expert, the
sequence-wise balance loss and the aux-loss-free expert-bias update on) trained 4 steps under FSDP2
and under expert parallelism EP2 (each rank holds 2 of the 4 experts; tokens travel by the
all-to-all dispatcher) gives the per-step losses (balance loss included), gradient norms, balance losses, expert-load
imbalance and final weights of one process on the same global batch, within 1e-5 relative, and the
same `expert_bias` (the loads are summed over the ranks before the sign update, so the two runs
take the same bias steps). Cases `moe_reference` (one process, with the llama reference),
`moe_fsdp2` and `moe_ep2` (in the shared 2-rank launch), and `moe_ep4_deredundancy` (EP4 with the
two-level alltoall_deredundancy dispatcher in device groups of 2 ranks, in the 4-rank launch) of
_trainer_worker.py; the EP2 checkpoint
(global names and shapes) then continues in one process as one process's own checkpoint does, and
the EP4 one under EP2 (`moe_ep2_from_moe_ep4_deredundancy`, in the 2-rank launch) likewise.
Expert data parallelism: `moe_ep2_fsdp2` (in the 4-rank launch) runs ep 2 over 4 data-parallel
ranks, each expert block FSDP-sharded over the 2 ranks holding it and its gradient reduced there,
against the same one process; evaluation during training under EP2 gives one process's eval
losses; a tiny Mixtral (softmax top-2 router, no shared expert, the switch balance loss) under EP2
matches its own one-process reference (`moe_mixtral_*`). EP2 x TP2 (`moe_ep2_tp2`, 4 ranks:
non-expert weights under the TP plan with SP, experts split over ep and replicated over tp, their
gradients all-reduced over tp) matches the same one process. Sequences split over ranks keep the
balance loss exact (each rank's share from the whole sequences' counts and its own tokens' score
sums): TP2 (`moe_tp2`), CP2 (`moe_cp2`) and CP2 x EP2 (`moe_cp2_ep2`, the ep ranks being the cp
ranks), in the 2-rank launch.
Pipeline stages (`moe_pp2`, 2 ranks, 1f1b, 4 micro-batches of 1 sample): a 3-layer DeepSeek-V3
(dense layer 0 and MoE layer 1 on stage 0, MoE layer 2 on stage 1) matches its one-process
reference `moe_reference3`: each stage's balance loss enters the objective per micro-batch and is
differentiated in that stage's backward, and both stages' loads reach the bias update of every layer.
PP2 x EP2 (`moe_pp2_ep2`, 4 ranks): the same stages with each stage's experts split over its two
data-parallel ranks (tokens exchanged inside the stage, non-expert weights FSDP-sharded over the
pair, one micro-batch of 2 samples per slice) matches the same reference. The PP2 checkpoint
continues in one process as one process's own does.
The seed's parallelism example (TP2 x PP2 x EP8 over FSDP at world 32, `alltoall_deredundancy`,
`pipeline_parallel_overlap_p2p` and `_overlap_b_f`) scaled to 8 ranks (`moe_seed_layout`: TP2 x
PP2 x EP2 over FSDP2, device groups of 1 rank so that level 1 is an exchange, 2 micro-batches of
1 sample per slice so that the last stage runs a combined backward + forward) matches the same
3-layer model's one-process run over its first SHORT_STEPS steps (`moe_reference3_short`).
"""

from __future__ import annotations

import numpy as np
import pytest
from _case_results import assert_same_evaluations
from _case_results import case_result as _result
from _case_results import case_weights as _weights
from _case_results import check_param_norms
from _case_results import rel_err as _rel
from _launches import WORLD4_CASES, WORLD8_CASES, run_one_process
from _trainer_worker import CASES, GLOBAL_BATCH, MIXTRAL_MODEL, MOE_LAYERS, MOE_MODEL, MORE, STEPS, steps_of

RTOL = 1e-5


@pytest.fixture(scope="module")
def runs(reference, world2):
    return reference


def _launch_of(case: str) -> str:
    return "world8" if case in WORLD8_CASES else "world4" if case in WORLD4_CASES else "world2"


def _launched(request, case: str):
    """The workdir once the launch running `case` (the 2-, 4- or 8-rank one) has finished."""
    request.getfixturevalue(_launch_of(case))
    return request.getfixturevalue("reference")


# (layout, its one-process reference): the DeepSeek-V3 cases (EP4 with the two-level
# alltoall_deredundancy dispatcher in device groups of 2 ranks among them), and the Mixtral one under EP2.
PARITY = [("moe_fsdp2", "moe_reference"), ("moe_ep2", "moe_reference"), ("moe_ep2_fsdp2", "moe_reference"),
          ("moe_ep4_deredundancy", "moe_reference"), ("moe_mixtral_ep2", "moe_mixtral_reference"),
          ("moe_ep2_tp2", "moe_reference"), ("moe_tp2", "moe_reference"), ("moe_cp2", "moe_reference"),
          ("moe_cp2_ep2", "moe_reference"), ("moe_pp2", "moe_reference3"), ("moe_pp2_ep2", "moe_reference3"),
          ("moe_pp2_tp2", "moe_reference3"), ("moe_seed_layout", "moe_reference3_short")]


def _model(case: str) -> dict:
    return MIXTRAL_MODEL if case.startswith("moe_mixtral") else MOE_MODEL


@pytest.mark.parametrize("case, one_process", PARITY)     # not `reference`: that is the workdir fixture
def test_moe_training_matches_one_process(request, case, one_process):
    runs = _launched(request, case)
    ref, got = _result(runs, one_process), _result(runs, case)
    steps = steps_of(case)
    assert len(ref["losses"]) == len(got["losses"]) == steps and ref["losses"][-1] < ref["losses"][0]
    for key, a, b in (("loss", got["losses"], ref["losses"]), ("grad_norm", got["grad_norms"], ref["grad_norms"]),
                      *((k, got["moe"][k], ref["moe"][k]) for k in ("moe/aux_loss", "moe/max_imbalance"))):
        assert _rel(a, b) <= RTOL, f"{key}: {a} vs {b} (rel err {_rel(a, b):.2e})"
    check_param_norms(ref, got, RTOL)
    assert min(ref["moe"]["moe/aux_loss"]) > 0      # the balance loss is on in every case
    want, have = _weights(runs, one_process), _weights(runs, case)
    assert set(have) == set(want)
    biases = [name for name in want if name.endswith("expert_bias")]
    # DeepSeek-V3's aux-loss-free bias (its MoE layers 1..); Mixtral's softmax router has none.
    moe_layers = range(MOE_MODEL["first_k_dense_replace"], MOE_LAYERS.get(case, MOE_MODEL["num_hidden_layers"]))
    assert biases == ([] if _model(case) is MIXTRAL_MODEL else
                      [f"layers.{i}.moe.router.expert_bias" for i in moe_layers]), biases
    for bias in biases:
        assert np.abs(want[bias]).max() > 0          # the bias moved ...
        np.testing.assert_array_equal(have[bias], want[bias])     # ... by the same sign steps
    for name in want:
        np.testing.assert_allclose(have[name], want[name], rtol=RTOL, atol=1e-6, err_msg=name)
    print(f"\n{case}: rel err loss {_rel(got['losses'], ref['losses']):.1e}, grad norm "
          f"{_rel(got['grad_norms'], ref['grad_norms']):.1e}, aux loss "
          f"{_rel(got['moe']['moe/aux_loss'], ref['moe']['moe/aux_loss']):.1e}; {got['seconds']:.0f} s on "
          f"{CASES[case][3]} ranks")


@pytest.mark.parametrize("case", ["moe_ep2", "moe_ep2_fsdp2", "moe_mixtral_ep2", "moe_ep2_tp2"])
def test_expert_parallel_dispatcher_moves_counts_then_the_routed_rows(request, case):
    """Per MoE layer and step (one micro-batch), PyNative: one all-to-all of the [ep, E/ep] int32
    counts (the row for the other rank: E/ep x 4 bytes), then four variable all-to-alls of H
    float32 rows: this rank's a assignments for the other rank's experts out (and their gradient
    back), the b rows it received back (and their gradient): 2 (a + b) H x 4 bytes, a and b at
    most T k (T = local_batch_size samples x 16 / tp tokens on each rank). That the bytes equal the routing's count exactly is proven on simulated
    ranks (mf-models test_expert_deredundancy.py) and on 4 real ranks by
    benchmarks/moe_dispatch_bench.py. DeepSeek-V3's first layer is dense; every Mixtral layer is
    a MoE layer."""
    got = _result(_launched(request, case), case)
    assert "EP" in got["dims"] and "ep=2" in got["dims"], got["dims"]
    (parallelism, training, _, _), model = CASES[case], _model(case)
    tokens = training["local_batch_size"] * 16 // parallelism.get("tensor_parallel", 1)
    ep, k, hidden = 2, model["num_experts_per_tok"], model["hidden_size"]
    local_experts = model.get("n_routed_experts", model.get("num_local_experts")) // ep
    moe_layers = model["num_hidden_layers"] - model.get("first_k_dense_replace", 0)
    counts, rows = got["comm"]["all_to_all/emulated"], got["comm"]["all_to_all_v/emulated"]
    assert counts["calls"] == moe_layers and counts["payload_bytes"] == moe_layers * (ep - 1) * local_experts * 4
    assert rows["calls"] == 4 * moe_layers
    row_bytes = 2 * hidden * 4
    assert rows["payload_bytes"] % row_bytes == 0, rows
    assert 0 < rows["payload_bytes"] // row_bytes <= moe_layers * 2 * tokens * k, rows


def test_two_level_dispatcher_moves_counts_then_the_routed_rows(request):
    """Per MoE layer and step, with M = 2 device groups of G = 2 ranks, 1 expert per rank, T = 16
    tokens per rank: the counts at each level (1 int32 to the other group, 1 to the other rank of
    the group); level 1 the rows of (token, other group hit) - tokens out and back and both
    gradients, the k expert ids once, the router weights and their gradient: 7 variable exchanges;
    level 2 the assignments for the other rank of the group, 4 exchanges. Nothing is all-gathered
    by the dispatcher any more (the ids travel with their rows). Exact byte counts: the simulated
    ranks of mf-models test_expert_deredundancy.py and benchmarks/moe_dispatch_bench.py."""
    got = _result(_launched(request, "moe_ep4_deredundancy"), "moe_ep4_deredundancy")
    tokens, k, hidden = 16, MOE_MODEL["num_experts_per_tok"], MOE_MODEL["hidden_size"]
    layers = MOE_MODEL["num_hidden_layers"] - MOE_MODEL["first_k_dense_replace"]
    counts, rows = got["comm"]["all_to_all/emulated"], got["comm"]["all_to_all_v/emulated"]
    assert counts["calls"] == 2 * layers and counts["payload_bytes"] == layers * (4 + 4), counts
    assert rows["calls"] == 11 * layers, rows
    # at most every token across once and every level-1 row's k assignments on within
    assert 0 < rows["payload_bytes"] <= layers * (tokens * (4 * hidden + 3 * k) + 2 * tokens * k * 4 * hidden) * 4
    assert "all_gather/emulated" not in got["comm"], got["comm"]


def test_the_seed_layout_runs_the_two_level_dispatcher_and_both_overlap_flags(request):
    """moe_seed_layout: pipeline rank 0 (layers 0-1: one MoE layer) exchanges routing counts as the
    two-level dispatcher with device groups of 1 rank does: one int32 to the other device group per
    exchange and none inside a group (the one-level dispatcher sends E/ep = 2 per exchange), twice
    per micro-batch (its forward, and the forward its backward recomputes). Every rank says once
    what each overlap flag cannot change on CPU; the last stage runs one combined backward + forward."""
    got = _result(_launched(request, "moe_seed_layout"), "moe_seed_layout")
    assert got["dims"].startswith("world=8 pp=2 dp_replicate=1 dp_shard=2 cp=1 tp=2 ep=2"), got["dims"]
    assert "overlap_p2p + overlap_b_f" in got["pipeline"]["schedule"], got["pipeline"]
    micro_batches = GLOBAL_BATCH // (2 * CASES["moe_seed_layout"][1]["local_batch_size"])     # dp 2
    counts = got["comm"]["all_to_all/emulated"]
    assert counts == {**counts, "calls": 2 * micro_batches, "payload_bytes": 2 * micro_batches * 4}, counts
    logs = request.getfixturevalue("world8").logs
    for rank, log in enumerate(logs):
        flags = [line for line in log.splitlines() if "pipeline_parallel_overlap_" in line]
        assert len(flags) == 2 and "overlap_p2p on mccl: changes nothing here" in flags[0], (rank, flags)
        mine = 1 if rank >= 4 else 0           # ranks 4-7 are pipeline rank 1 (pp is the outermost axis)
        assert (f"overlap_b_f on mccl: 1 pair (a backward and the forward of a later micro-batch after it; "
                f"{mine} on this rank)") in flags[1], (rank, flags)


def test_mixtral_reference_reads_the_expert_parallel_micro_batches(reference):
    """The switch balance loss is a per-micro-batch statistic: the Mixtral reference accumulates
    micro-batches of the EP2 ranks' size, so the parity above compares the same statistic."""
    assert CASES["moe_mixtral_reference"][1] == CASES["moe_mixtral_ep2"][1]
    assert min(_result(reference, "moe_mixtral_reference")["moe"]["moe/aux_loss"]) > 0


def test_evaluation_during_training_under_expert_parallelism_matches_one_process(runs):
    """eval_dataset under EP2: every rank evaluates every held-out batch through the all-to-all
    exchange (the experts split over both ranks); eval loss and accuracy at steps 2 and 4 are one
    process's."""
    assert_same_evaluations(_result(runs, "moe_ep2"), _result(runs, "moe_reference"))


def test_evaluation_during_training_in_moe_pipeline_stages_matches_one_process(runs):
    """eval_dataset under PP2 on the 3-layer DeepSeek-V3: forward only through the MoE stages (the
    chunks' balance loss and routing counts left out), one process's eval loss and accuracy."""
    assert_same_evaluations(_result(runs, "moe_pp2"), _result(runs, "moe_reference3"))


@pytest.fixture(scope="module")
def back_to_one_process(runs):
    """One process continues 2 steps from its own checkpoints and from the EP2 and PP2 ones (one
    start-up): {layout: (its continuation, one process's own)}."""
    pairs = {"moe_ep2": "moe_reference", "moe_pp2": "moe_reference3"}
    names = [f"{ref}_from_{src}" for src, ref in pairs.items()] + [f"{ref}_from_{ref}" for ref in pairs.values()]
    proc = run_one_process(runs, *names)
    if proc.returncode != 0:
        pytest.fail(f"one-process continuation failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return {src: (_result(runs, f"{ref}_from_{src}"), _result(runs, f"{ref}_from_{ref}")) for src, ref in pairs.items()}


@pytest.mark.parametrize("layout", ["moe_ep2", "moe_pp2"])
def test_expert_parallel_and_pipeline_checkpoints_continue_in_one_process(back_to_one_process, layout):
    """The EP2 and PP2 checkpoints hold the global layout (unchanged names, every expert, each
    stage's layers and expert biases), so one process loads them and continues with the losses of
    one process resumed from its own checkpoint. (PP2 x EP2's continues the same way: measured
    once, 0 relative; not a CI case, it would wait for the 4-rank launch.)"""
    got, want = back_to_one_process[layout]
    assert got["start_step"] == want["start_step"] == STEPS and len(got["losses"]) == MORE
    assert _rel(got["losses"], want["losses"]) <= RTOL, f"{got['losses']} vs {want['losses']}"


def test_expert_parallel_checkpoint_continues_under_another_ep_size(request, back_to_one_process):
    """The EP4 checkpoint of the two-level dispatcher (each rank held 1 of the 4 experts) loads
    under EP2 (2 experts per rank, the alltoall dispatcher) in the 2-rank launch, and the 2 steps
    continued from it are those of one process continued from its own checkpoint: losses, grad
    norms and the final weights within 1e-5, the same expert_bias."""
    want = back_to_one_process["moe_ep2"][1]          # one process continued from its own checkpoint
    runs = _launched(request, "moe_ep2")
    got = _result(runs, "moe_ep2_from_moe_ep4_deredundancy")
    assert "ep=2" in got["dims"] and got["start_step"] == want["start_step"] == STEPS and len(got["losses"]) == MORE
    for key in ("losses", "grad_norms"):
        assert _rel(got[key], want[key]) <= RTOL, f"{key}: {got[key]} vs {want[key]} (rel err {_rel(got[key], want[key]):.2e})"
    have, ref = _weights(runs, "moe_ep2_from_moe_ep4_deredundancy"), _weights(runs, "moe_reference_from_moe_reference")
    assert set(have) == set(ref)
    np.testing.assert_array_equal(have["layers.1.moe.router.expert_bias"], ref["layers.1.moe.router.expert_bias"])
    for name in ref:
        np.testing.assert_allclose(have[name], ref[name], rtol=RTOL, atol=1e-6, err_msg=name)
