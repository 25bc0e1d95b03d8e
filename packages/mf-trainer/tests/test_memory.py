"""mf_trainer.memory_plan: per-rank bytes counted by hand for conftest's tiny llama (vocab 64,
hidden 32, intermediate 64, 2 layers, 2 heads of 16, untied output; batch 2 of 32 tokens, 2
micro-batches per step on one rank). The measured check (a real run's peak) is in
tests-integration/memory."""

from __future__ import annotations

import subprocess
import sys

import pytest

import mf_config
import mf_parallel as mp
import mf_trainer
from mf_trainer.memory import candidate_layouts, parse_bytes

PARAMS = 2048 + 2 * (64 + 4 * 1024 + 3 * 2048) + 32 + 2048            # 24736
# FSDP over 3 ranks: ceil(rows / 3) rows of every parameter (dim 0 padded to a multiple of 3)
FSDP3 = 22 * 32 + 2 * (2 * 11 + 4 * 11 * 32 + 2 * 22 * 32 + 11 * 64) + 11 + 22 * 32   # 8503
LAYER = (32 * 32 + 32 * 32) * 2 + 32 * (3 * (32 + 32) + 32) + 3 * 2 * 32 * 32 + 32 * 32 + 4 * 32 * 64
HEAD = 32 * 32 + 32 * 32 + 32 * 32        # the final norm's input and output, the fused loss's input gradient


def _plan(tmp_path, tiny_config, world=1, **sections):
    cfg = mf_config.load_config(tiny_config(tmp_path, tmp_path / "none", **sections))
    return mf_trainer.memory_plan(cfg, mp.Layout.resolve(cfg.parallelism, world, "CPU"))


def test_one_rank_by_hand(tmp_path, tiny_config):
    (r,) = _plan(tmp_path, tiny_config).ranks
    assert r.parameters == PARAMS * 4
    assert r.gradients == PARAMS * 4           # float32 accumulation buffers (2 micro-batches)
    assert r.optimizer == PARAMS * 8           # exp_avg + exp_avg_sq
    assert r.activations_per_microbatch == (2 * LAYER + HEAD) * 2 * 4 and r.in_flight == 1
    # The larger of the fused loss's chunk (2 x 32 tokens: one chunk) three times and its weight
    # gradient, and half a layer's gradients (2 samples of LAYER).
    assert r.transient == max(3 * 2 * 32 * 64 + 64 * 32, 2 * LAYER // 2) * 4 == LAYER * 4
    assert r.fsdp_gathered == 0


def test_fsdp_pads_dim0_to_the_shard_count(tmp_path, tiny_config):
    (r,) = _plan(tmp_path, tiny_config, world=3, training={"global_batch_size": 6}).ranks
    assert r.parameters == FSDP3 * 4 and r.optimizer == FSDP3 * 8
    # the biggest FSDP unit is a layer (10304 elements; the root holds 4128): gathered, plus its full gradient
    assert r.fsdp_gathered == 10304 * 4 * 2


def test_tensor_parallel_halves_the_split_features(tmp_path, tiny_config):
    (one,) = _plan(tmp_path, tiny_config).ranks
    (two,) = _plan(tmp_path, tiny_config, world=2, parallelism={"tensor_parallel": 2},
                   training={"global_batch_size": 4}).ranks
    norms = 2 * 2 * 32 + 32
    assert two.parameters == ((PARAMS - norms) // 2 + norms) * 4
    assert two.activations_per_microbatch < one.activations_per_microbatch * 0.6


def test_recompute_keeps_the_layer_input_and_rebuilds_one_layer(tmp_path, tiny_config):
    (none,) = _plan(tmp_path, tiny_config).ranks
    (full,) = _plan(tmp_path, tiny_config, recompute={"mode": "full", "full_recompute_layer": ["0-1"]}).ranks
    assert full.activations_per_microbatch == (2 * 32 * 32 + HEAD) * 2 * 4
    assert full.transient == none.transient + (LAYER - 32 * 32) * 2 * 4
    (sel,) = _plan(tmp_path, tiny_config, recompute={"mode": "select", "select_module": {"feed_forward": ["0"]}}).ranks
    assert none.activations_per_microbatch - sel.activations_per_microbatch == 4 * 32 * 64 * 2 * 4
    plan = _plan(tmp_path, tiny_config, recompute={"mode": "select", "select_module": {"attention.wq": ["0"]}})
    assert any("attention.wq: not estimated" in n for n in plan.notes)


def test_swap_moves_kept_activations_off_the_device_but_not_on_cpu(tmp_path, tiny_config):
    def plan(device, **sections):
        cfg = mf_config.load_config(tiny_config(tmp_path, tmp_path / "none", **sections))
        return mf_trainer.memory_plan(cfg, mp.Layout.resolve(cfg.parallelism, 1, device))

    swap = {"enable": True, "layer_swap": [{"layers": ["0"]}], "op_swap": [{"op_name": "mlp", "layers": ["1"]}]}
    (cpu,) = plan("CPU", swap=swap).ranks
    (base,) = plan("CPU").ranks
    assert (cpu.activations, cpu.transient) == (base.activations, base.transient)
    assert any("nothing leaves the device" in n for n in plan("CPU", swap=swap).notes)
    # Ascend (float32 here, as the model asks): layer 0 whole and layer 1's MLP leave the device;
    # the biggest swapped unit (layer 0) is back on it at a time
    ascend = plan("Ascend", swap=swap, model={"compute_dtype": "float32"})
    (none,) = plan("Ascend", model={"compute_dtype": "float32"}).ranks
    (r,) = ascend.ranks
    mlp = 4 * 32 * 64
    assert none.activations_per_microbatch - r.activations_per_microbatch == (LAYER + mlp) * 2 * 4
    assert r.transient - none.transient == LAYER * 2 * 4
    assert any(n.startswith(f"swap: {(LAYER + mlp) * 2 * 4 / 2**20:.1f} MiB per micro-batch") for n in ascend.notes)
    # a fully recomputed layer keeps its input, which swap moves
    (both,) = plan("Ascend", swap=swap, model={"compute_dtype": "float32"},
                   recompute={"mode": "full", "full_recompute_layer": ["0"]}).ranks
    (rc,) = plan("Ascend", model={"compute_dtype": "float32"},
                 recompute={"mode": "full", "full_recompute_layer": ["0"]}).ranks
    assert rc.activations_per_microbatch - both.activations_per_microbatch == (32 * 32 + mlp) * 2 * 4


def test_pipeline_stages_hold_their_layers_and_ends(tmp_path, tiny_config):
    plan = _plan(tmp_path, tiny_config, world=2, parallelism={"pipeline_parallel": 2},
                 training={"global_batch_size": 8})
    first, last = plan.ranks
    assert first.layers == (0,) and last.layers == (1,)
    assert first.parameters == (2048 + 10304) * 4 and last.parameters == (10304 + 32 + 2048) * 4
    assert first.in_flight == 2 and last.in_flight == 1      # 1F1B: pp - rank micro-batches held


@pytest.mark.parametrize("parallelism, first_params, last_params", [
    # FSDP2 inside each stage: every dim 0 is even, so each rank holds half of its stage.
    ({"pipeline_parallel": 2}, (2048 + 10304) // 2, (10304 + 32 + 2048) // 2),
    # TP2 inside each stage: the norms (2 x 32 per layer, 32 final) stay whole, the embedding and
    # the output split by vocabulary, wq/wk/wv/wo and w1/w2/w3 by halves.
    ({"pipeline_parallel": 2, "tensor_parallel": 2}, 1024 + 64 + 2048 + 3072, 64 + 2048 + 3072 + 32 + 1024),
])
def test_pipeline_stages_under_fsdp_or_tp_hold_their_share(tmp_path, tiny_config, parallelism, first_params,
                                                           last_params):
    plan = _plan(tmp_path, tiny_config, world=4, parallelism=parallelism, training={"global_batch_size": 8})
    first, last = plan.ranks
    assert (first.parameters, last.parameters) == (first_params * 4, last_params * 4)
    assert first.optimizer == 2 * first.parameters and last.optimizer == 2 * last.parameters


def test_deepseek_v3_parameters_are_the_built_models_and_experts_stay_gathered(tmp_path, tiny_config):
    """The tiny DeepSeek-V3 (MLA, layer 0 dense, 4 routed + 1 shared expert in layer 1): parameters
    are every element build_model makes; gradients and moments leave out the untrained expert_bias;
    under FSDP the router and the experts (units without reshard-after-forward) stay gathered."""
    import mf_models

    section = mf_models.tiny_model_section("deepseek_v3")
    model = mf_models.build_model(section, init=False)
    total = sum(p.size for p in model.get_parameters())
    trained = sum(p.size for p in model.trainable_params())
    assert total - trained == 4                                   # layers.1.moe.router.expert_bias
    (r,) = _plan(tmp_path, tiny_config, model=section).ranks
    assert (r.parameters, r.gradients, r.optimizer) == (total * 4, trained * 4, trained * 8)
    assert r.activations_per_microbatch > 0
    (f,) = _plan(tmp_path, tiny_config, world=2, model=section).ranks
    experts = 4 + 4 * 32 + 3 * 4 * 16 * 32                       # expert_bias, gate, w1/w2/w3
    dense_layer = 32 + 24 * 32 + 24 + 48 * 24 + 20 * 32 + 16 + 64 * 16 + 32 * 32 + 32 + 3 * 48 * 32   # layer 0
    assert f.fsdp_gathered == (dense_layer + experts) * 4 + dense_layer * 4


@pytest.mark.parametrize("world", [2, 4])
def test_expert_parallel_ranks_gather_only_their_own_experts(tmp_path, tiny_config, world):
    """The tiny DeepSeek-V3 under EP2: each rank stores the same number of expert rows as under
    FSDP (E / ep experts, FSDP-sharded over the world / ep ranks holding them), but gathers only
    its own 2 experts (on 2 ranks: none at all, they are whole), and its MoE activations are the
    all-to-all dispatcher's."""
    import mf_models

    section = mf_models.tiny_model_section("deepseek_v3")
    batch = {"global_batch_size": 2 * world}
    (fsdp,) = _plan(tmp_path, tiny_config, world=world, model=section, training=batch).ranks
    (ep,) = _plan(tmp_path, tiny_config, world=world, model=section, training=batch,
                  parallelism={"expert_parallel": 2}).ranks
    assert (ep.parameters, ep.gradients, ep.optimizer) == (fsdp.parameters, fsdp.gradients, fsdp.optimizer)
    weights = 3 * 16 * 32                                        # w1/w2/w3 of one expert
    dense_layer = 32 + 24 * 32 + 24 + 48 * 24 + 20 * 32 + 16 + 64 * 16 + 32 * 32 + 32 + 3 * 48 * 32   # layer 0
    router = 4 + 4 * 32
    gathered_experts = 0 if world == 2 else 2 * weights
    assert fsdp.fsdp_gathered - ep.fsdp_gathered == (4 * weights - gathered_experts) * 4
    assert ep.fsdp_gathered == (dense_layer + router + gathered_experts) * 4 + dense_layer * 4
    _, args = mf_models.build_args(section)
    tokens = 2 * 32
    grown = mf_models.moe_activations(args, tokens, 2)["total"] - mf_models.moe_activations(args, tokens)["total"]
    assert ep.activations_per_microbatch - fsdp.activations_per_microbatch == grown * 4


def test_unsized_sizes_are_one_line(tmp_path, tiny_config):
    assert parse_bytes("64GB") == 64 << 30 and parse_bytes("512MiB") == 512 << 20 and parse_bytes("1000") == 1000
    for bad in ("lots", "-3GB", "0"):
        with pytest.raises(mf_trainer.TrainerConfigError, match="--device-memory"):
            parse_bytes(bad)


def test_candidate_layouts_mark_what_fits(tmp_path, tiny_config):
    cfg = mf_config.load_config(tiny_config(tmp_path, tmp_path / "none", training={"global_batch_size": 8}))
    rows = candidate_layouts(cfg, 4, device_memory=parse_bytes("64KiB"))
    assert rows[1].split() == ["tp", "pp", "fsdp", "no", "recompute", "full", "recompute"]
    body = rows[2:-1]
    assert [r.split()[:3] for r in body] == \
        [["1", "1", "4"], ["1", "2", "2"], ["2", "1", "2"], ["2", "2", "1"]]   # tp 4 > 2 heads; pp 4 > 2 layers
    assert all(r.split()[4] == "no" for r in body)   # none of them fits in 64 KiB


def test_the_memory_plan_imports_no_mindspore(tmp_path, tiny_config):
    code = ("import sys, mf_config, mf_parallel, mf_trainer\n"
            f"cfg = mf_config.load_config({tiny_config(tmp_path, tmp_path / 'none')!r})\n"
            "print(mf_trainer.memory_plan(cfg, mf_parallel.Layout.resolve(cfg.parallelism, 1)).peak)\n"
            "assert not any(m.split('.')[0] == 'mindspore' for m in sys.modules), 'mindspore imported'\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr


def test_recompute_comm_acts_under_tp_and_is_a_notice_without_it(tmp_path, tiny_config):
    cfg = mf_config.load_config(tiny_config(
        tmp_path, tmp_path / "none", recompute_comm={"enable": True, "select_module": {"attention": ["0-1"]}},
        monitor={"train_state": {"local_norm": "wq"}}))
    report = mf_trainer.preflight(cfg, "launch", 2, "CPU")   # nothing to recompute: accepted, one notice
    assert report.ok and "tensor_parallel is 1: there are none here" in dict(report.notices)["recompute_comm.enable"]
    alone = mf_trainer.preflight(cfg, "train", 1, "CPU")
    assert alone.ok and "a single-process run has none" in dict(alone.notices)["recompute_comm.enable"]
    tp2 = mf_config.load_config(tiny_config(
        tmp_path, tmp_path / "none", parallelism={"tensor_parallel": 2},
        recompute_comm={"enable": True, "select_module": {"attention.qkv": ["0-1"], "ffn_norm": ["1"]}}))
    assert not [k for k, _ in mf_trainer.preflight(tp2, "launch", 2, "CPU").problems if k.startswith("recompute_comm")]
    bad = mf_config.load_config(tiny_config(
        tmp_path, tmp_path / "none", parallelism={"tensor_parallel": 2},
        recompute_comm={"enable": True, "select_module": {"attention.wo": ["0"]}}))
    why = dict(mf_trainer.preflight(bad, "launch", 2, "CPU").problems)["recompute_comm.select_module['attention.wo']"]
    assert why.startswith("names no sequence-parallel all-gather; choose from attention, attention.qkv")


def test_recompute_comm_estimate_drops_the_gathered_inputs(tmp_path, tiny_config):
    """Each selected gather keeps (seq - seq/tp) x hidden x batch fewer activation elements."""
    def plan(**extra):
        cfg = mf_config.load_config(tiny_config(tmp_path, tmp_path / "none", parallelism={"tensor_parallel": 2},
                                                **extra))
        return mf_trainer.memory_plan(cfg, mp.Layout.resolve(cfg.parallelism, 2, "CPU"))

    base = plan()
    some = plan(recompute_comm={"enable": True, "select_module": {"attention_norm": ["0-1"], "feed_forward": ["0"]}})
    seq, hidden, batch, tp, fp32 = 32, 32, 2, 2, 4          # tiny_config's
    assert base.ranks[0].activations - some.ranks[0].activations == 3 * (seq - seq // tp) * hidden * batch * fp32
    assert any(n.startswith("recompute_comm: 3 sequence-parallel all-gathered inputs") for n in some.notes)
    assert some.ranks[0].parameters == base.ranks[0].parameters


def test_moe_pipeline_stages_hold_what_the_stages_keep(tmp_path, tiny_config):
    """The tiny DeepSeek-V3 in two pipeline stages (dense layer 0 + embedding, MoE layer 1 + head):
    each stage's parameters are the elements `pipeline_stage` keeps of the built model, its
    expert_bias included. Under PP2 x EP2 (4 ranks) each rank of the MoE stage stores as many
    rows as FSDP2 gives it but keeps its 2 experts whole (nothing of them gathered); the dense
    stage is FSDP's alone (`mf plan` prints these per stage)."""
    import mf_models
    import mf_parallel as mp

    section = mf_models.tiny_model_section("deepseek_v3")
    plan = _plan(tmp_path, tiny_config, world=2, model=section, parallelism={"pipeline_parallel": 2})
    layout = mp.StageLayout.build(mp.resolve_pipeline(2), [[0], [1]])
    for rank, planned in enumerate(plan.ranks):
        stage = mf_models.pipeline_stage(mf_models.build_model(section, init=False), layout, rank)
        assert planned.parameters == sum(p.size for p in stage.get_parameters()) * 4
    batch = {"global_batch_size": 8}
    fsdp = _plan(tmp_path, tiny_config, world=4, model=section, training=batch,
                 parallelism={"pipeline_parallel": 2}).ranks
    ep = _plan(tmp_path, tiny_config, world=4, model=section, training=batch,
               parallelism={"pipeline_parallel": 2, "expert_parallel": 2}).ranks
    assert [r.parameters for r in ep] == [r.parameters for r in fsdp]
    weights = 3 * 16 * 32                                        # w1/w2/w3 of one expert
    assert ep[0].fsdp_gathered == fsdp[0].fsdp_gathered
    # The 4 experts are no longer gathered; the largest full gradient before its reduce-scatter
    # (FSDP2: the router + experts unit) shrinks to the next largest unit, by at most the same.
    saved = fsdp[1].fsdp_gathered - ep[1].fsdp_gathered
    assert 4 * weights * 4 <= saved <= 2 * (4 * weights + 4 + 4 * 32) * 4
