"""The preflight under expert parallelism: the layouts that run (ep = the data-parallel size or a
divisor of it on a MoE model, alltoall with or without tensor parallelism, alltoall_deredundancy
over every data-parallel rank, beside tensor parallelism and in pipeline stages), and one keyed
line for each combination that is refused."""

from __future__ import annotations

import pytest

import mf_config
import mf_trainer

# A tiny Mixtral: 4 routed experts, top-2 (mf-config accepts it; the preflight decides the layout).
MIXTRAL = {"model_type": "mixtral", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "max_position_embeddings": 64, "num_local_experts": 4, "num_experts_per_tok": 2}


DEREDUNDANCY = {"moe_token_dispatcher_type": "alltoall_deredundancy"}


def _lines(tmp_path, tiny_config, parallelism, world, model=None):
    raw = tiny_config(tmp_path, tmp_path / "none", parallelism=parallelism, model=model or MIXTRAL,
                      training={"local_batch_size": 1, "global_batch_size": 8})
    return mf_trainer.preflight(mf_config.load_config(raw), "launch", world=world, device="CPU").lines()


@pytest.mark.parametrize("parallelism, world", [({"expert_parallel": 2}, 2), ({"expert_parallel": 4}, 4),
                                                ({"expert_parallel": 2, "moe_token_dispatcher_type": "alltoall"}, 2),
                                                (DEREDUNDANCY | {"expert_parallel": 4, "npu_nums_per_device": 2}, 4),
                                                (DEREDUNDANCY | {"expert_parallel": 2, "npu_nums_per_device": 1}, 2),
                                                (DEREDUNDANCY | {"expert_parallel": 2, "npu_nums_per_device": 2}, 2),
                                                ({"expert_parallel": 2}, 4), ({"expert_parallel": 2}, 8),
                                                ({"expert_parallel": 2, "tensor_parallel": 2}, 4),
                                                ({"expert_parallel": 2, "tensor_parallel": 2}, 8),
                                                ({"expert_parallel": 2, "context_parallel": 2}, 2),
                                                ({"expert_parallel": 4, "context_parallel": 2}, 4),
                                                ({"expert_parallel": 2, "pipeline_parallel": 2}, 4),
                                                # the two-level dispatcher beside tp, in pipeline stages, and
                                                # the seed's TP2 x PP2 x EP over FSDP layout kinds (8 and 32 ranks)
                                                (DEREDUNDANCY | {"expert_parallel": 2, "npu_nums_per_device": 1,
                                                                 "tensor_parallel": 2}, 4),
                                                (DEREDUNDANCY | {"expert_parallel": 2, "npu_nums_per_device": 2,
                                                                 "pipeline_parallel": 2}, 4),
                                                (DEREDUNDANCY | {"expert_parallel": 2, "npu_nums_per_device": 1,
                                                                 "tensor_parallel": 2, "pipeline_parallel": 2}, 8),
                                                (DEREDUNDANCY | {"expert_parallel": 4, "npu_nums_per_device": 4,
                                                                 "tensor_parallel": 2, "pipeline_parallel": 2}, 16)])
def test_expert_parallel_over_the_data_parallel_ranks_runs(tmp_path, tiny_config, parallelism, world):
    assert _lines(tmp_path, tiny_config, parallelism, world) == []


@pytest.mark.parametrize("parallelism, world", [({"tensor_parallel": 2}, 2), ({"context_parallel": 2}, 2),
                                                ({"expert_parallel": 2, "tensor_parallel": 2}, 4),
                                                ({"expert_parallel": 2, "context_parallel": 2}, 2)])
def test_a_balance_loss_runs_where_ranks_split_the_sequences(tmp_path, tiny_config, parallelism, world):
    """Sequence / context parallelism split the sequences a balance loss is taken over: each rank's
    share comes from the whole sequences' counts (mf_models' SplitSequences), so nothing is refused."""
    assert _lines(tmp_path, tiny_config, parallelism, world, {**MIXTRAL, "output_router_logits": True}) == []


LLAMA = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 2, "max_position_embeddings": 64}

REFUSED = [
    ({"expert_parallel": 2}, 2, LLAMA,
     "parallelism.expert_parallel: 2 > 1, but model 'llama' has no routed MoE layers to split; set it to 1"),
    ({"expert_parallel": 3}, 3, None,
     "parallelism.expert_parallel: 3 does not divide model.num_local_experts = 4"),
    ({"expert_parallel": 4}, 2, None,
     "parallelism.expert_parallel: 4 does not divide data_parallel_shard x context_parallel = 2 x 1 = 2"),
    # The two-level dispatcher is proven over the data-parallel ranks only, not over cp ranks.
    (DEREDUNDANCY | {"expert_parallel": 2, "context_parallel": 2, "npu_nums_per_device": 2}, 2, None,
     "parallelism.moe_token_dispatcher_type: 'alltoall_deredundancy' with context_parallel 2 is not proven yet"),
    # MoE pipeline stages with their experts over every data-parallel rank of a stage, alltoall only.
    ({"expert_parallel": 2, "pipeline_parallel": 2}, 8, None,
     "parallelism.pipeline_parallel: 2 with data-parallel ranks (world=8 pp=2 dp_replicate=1 dp_shard=4"),
    ({"expert_parallel": 2, "data_parallel_shard": 2}, 4, None,
     "parallelism.expert_parallel: 2 with data-parallel replicas (HSDP: data_parallel_shard 2 of 4) is not proven"),
    ({"expert_parallel": 2, "data_parallel_shard": 2, "tensor_parallel": 2}, 8, None,
     "parallelism.expert_parallel: 2 with data-parallel replicas (HSDP: data_parallel_shard 2 of 4) is not proven"),
    ({"expert_parallel": 2, "data_parallel_shard_strategy": "no_shard"}, 2, None,
     "parallelism.data_parallel_shard_strategy: 'no_shard' with expert_parallel 2: the ep ranks are carved out of "
     "the FSDP shard ranks; use 'optim_grads_params'"),
    (DEREDUNDANCY | {"expert_parallel": 4, "npu_nums_per_device": 3}, 4, None,
     "parallelism.npu_nums_per_device: 3 does not divide expert_parallel 4 (alltoall_deredundancy groups the ep "
     "ranks by npu_nums_per_device; expert_parallel must be a multiple of it); use one of [1, 2, 4]"),
    # The two-level dispatcher is proven with ep over every data-parallel rank (EP4 in groups of 2, and
    # beside tp and pipeline stages on 8 ranks).
    (DEREDUNDANCY | {"expert_parallel": 2, "npu_nums_per_device": 2}, 4, None,
     "parallelism.moe_token_dispatcher_type: 'alltoall_deredundancy' with expert_parallel 2 below the 4 "
     "data-parallel ranks is not proven yet"),
]

# The dispatcher's group size where the dispatcher has no groups: accepted, one notice line.
NOTICED = [
    ({"expert_parallel": 2, "npu_nums_per_device": 2}, 2,
     "notice: parallelism.npu_nums_per_device: 2 only acts with moe_token_dispatcher_type 'alltoall_deredundancy'"),
    ({"npu_nums_per_device": 2}, 2,
     "notice: parallelism.npu_nums_per_device: 2 only acts with expert_parallel > 1 and moe_token_dispatcher_type "
     "'alltoall_deredundancy'"),
]


@pytest.mark.parametrize("parallelism, world, line", NOTICED)
def test_dispatcher_knobs_without_their_dispatcher_are_notices(tmp_path, tiny_config, parallelism, world, line):
    cfg = mf_config.load_config(tiny_config(tmp_path, tmp_path / "none", parallelism=parallelism, model=MIXTRAL,
                                            training={"local_batch_size": 1, "global_batch_size": 8}))
    report = mf_trainer.preflight(cfg, "launch", world=world, device="CPU")
    assert report.ok, report.lines()
    assert [n for n in report.notice_lines() if n.startswith(line)], report.notice_lines()


@pytest.mark.parametrize("parallelism, world, model, line", REFUSED)
def test_expert_parallel_refusals_are_one_keyed_line(tmp_path, tiny_config, parallelism, world, model, line):
    lines = _lines(tmp_path, tiny_config, parallelism, world, model)
    assert any(got.startswith(line) for got in lines), lines
    assert len([got for got in lines if got.startswith(line.split(":")[0])]) == 1, lines


@pytest.mark.parametrize("world", [2, 4])
def test_evaluation_during_training_under_expert_parallelism_runs(tmp_path, tiny_config, world):
    """Every rank evaluates through the exchange (the dist case moe_ep2 proves it against one process)."""
    raw = tiny_config(tmp_path, tmp_path / "none", parallelism={"expert_parallel": 2}, model=MIXTRAL,
                      training={"local_batch_size": 1, "global_batch_size": 8})
    raw["eval_dataset"] = {"dataloader": dict(raw["train_dataset"]["dataloader"], sizes=[0, 50, 0]),
                           "eval_interval": 2, "eval_iters": 2}
    assert mf_trainer.preflight(mf_config.load_config(raw), "launch", world=world, device="CPU").lines() == []
