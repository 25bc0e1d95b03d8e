"""Layout: the `parallelism` section resolved once - the world split (with the no_shard -> DDP
rule), the pipeline spec, the CP settings, the FSDP and dispatcher options, the idle fields and
every refusal as one keyed line. Pure Python: no MindSpore."""

from __future__ import annotations

import subprocess
import sys

import pytest

import mf_parallel as mp
from mf_parallel import Layout, ParallelConfigError


def idle(layout) -> dict[str, str]:
    return {i.field: i.reason for i in layout.idle}


# ----------------------------------------------------------------------------- the world split
def test_defaults_are_pure_fsdp_and_a_positive_shard_is_hsdp():
    dims = Layout.resolve({}, 8).dims
    assert (dims.dp_replicate, dims.dp_shard, dims.tp) == (1, 8, 1)
    assert Layout.resolve(None, 4).dims.dp_shard == 4
    dims = Layout.resolve({"data_parallel_shard": 2, "tensor_parallel": 2}, 8).dims
    assert (dims.dp_replicate, dims.dp_shard, dims.tp) == (2, 2, 2)


def test_objects_with_the_field_names_and_nulls_read_as_defaults():
    class Block:
        data_parallel_shard = None           # null: the default (-1)
        tensor_parallel = 2
        pipeline_parallel = 2
        reshard_after_forward_policy = "always"

    layout = Layout.resolve(Block(), 8)
    assert (layout.dims.pp, layout.dims.dp_shard, layout.dims.tp) == (2, 2, 2)
    assert layout.fsdp.reshard_after_forward_policy == "always" and layout.fields["data_parallel_shard"] == -1


def test_no_shard_makes_every_data_parallel_rank_a_replica():
    dims = Layout.resolve({"data_parallel_shard_strategy": "no_shard", "tensor_parallel": 2}, 8).dims
    assert (dims.dp_replicate, dims.dp_shard, dims.tp) == (4, 1, 2) and "DDP" in dims.describe()
    with pytest.raises(ParallelConfigError, match=r"^parallelism.data_parallel_shard: 2 shards, but "
                                                  r"data_parallel_shard_strategy is 'no_shard'"):
        Layout.resolve({"data_parallel_shard_strategy": "no_shard", "data_parallel_shard": 2}, 4)


@pytest.mark.parametrize("block, world, fragment", [
    ({"data_parallel_shard": 3}, 8, "parallelism.data_parallel_shard: 3 does not divide the data-parallel size 8"),
    ({"tensor_parallel": 3}, 8, "tensor_parallel (3) = 3 does not divide the world size 8"),
    ({"pipeline_parallel": 2, "tensor_parallel": 4}, 4, "= 8 does not divide the world size 4"),
    ({"expert_parallel": 3}, 8, "parallelism.expert_parallel: 3 does not divide data_parallel_shard x context_parallel = "
                                "8 x 1 = 8"),
    ({"tensor_parallel": 0}, 8, "parallelism.tensor_parallel: must be a positive integer, got 0"),
    ({"context_parallel": -2}, 8, "parallelism.context_parallel: must be a positive integer, got -2"),
    ({"data_parallel_shard": 0}, 8, "must be a positive integer (or -1 for all remaining ranks), got 0"),
    ({"tensor_parallel": "2"}, 8, "parallelism.tensor_parallel: must be an integer, got '2'"),
    ({"tensor_parallel": True}, 8, "parallelism.tensor_parallel: must be an integer, got True"),
    ({"tensor_paralel": 2}, 8, "parallelism.tensor_paralel: not a field of the parallelism section"),
    ({}, 0, "world size must be a positive integer, got 0"),
    ({"data_parallel_shard_strategy": "optim"}, 8, "parallelism.data_parallel_shard_strategy: 'optim' (ZeRO-1: "
                                                   "sharded optimizer states with replicated parameters) is not "
                                                   "implemented"),
    ({"cpu_offload": True}, 8, "parallelism.cpu_offload: not supported by mf-parallel on Ascend yet"),
    ({"reshard_after_forward_policy": "sometimes"}, 8, "parallelism.reshard_after_forward_policy: must be one of "
                                                       "always, never, default, got 'sometimes'"),
    ({"pipeline_parallel": 2, "pipeline_parallel_schedule": "gpipe", "pipeline_parallel_interleave_num": 2}, 8,
     "parallelism.pipeline_parallel_interleave_num: must be 1 with pipeline_parallel_schedule 'gpipe'"),
    ({"context_parallel": 2, "context_parallel_method": "hybrid"}, 8,
     "parallelism.ulysses_degree_in_cp: is required with context_parallel_method 'hybrid'"),
    ({"expert_parallel": 4, "moe_token_dispatcher_type": "alltoall_deredundancy", "npu_nums_per_device": 3}, 8,
     "parallelism.npu_nums_per_device: 3 does not divide expert_parallel 4"),
    ({"expert_parallel": 2, "moe_token_dispatcher_type": "allgather"}, 8,
     "parallelism.moe_token_dispatcher_type: 'allgather' is not implemented; use one of alltoall, "
     "alltoall_deredundancy"),
])
def test_every_refusal_is_one_keyed_line(block, world, fragment):
    with pytest.raises(ParallelConfigError) as err:
        Layout.resolve(block, world, "Ascend")
    message = str(err.value)
    assert fragment in message and "\n" not in message, message


def test_check_resolves_the_parts_independently():
    layout, problems = Layout.check({"data_parallel_shard_strategy": "optim", "data_parallel_shard": 3,
                                     "pipeline_parallel": 2, "pipeline_parallel_schedule": "gpipe",
                                     "pipeline_parallel_interleave_num": 2, "context_parallel_method": "ulysses"}, 8)
    assert set(problems) == {"strategy", "dims", "pipeline"}
    assert layout.dims is None and layout.pipeline is None and layout.fsdp is None
    assert layout.context == mp.ContextParallelSettings() and "context_parallel_method" in idle(layout)
    assert Layout.check({"tensor_parallel": 0}).layout is None


# ----------------------------------------------------------------------------- the parts
def test_pipeline_spec_and_stage_placement():
    layout = Layout.resolve({"pipeline_parallel": 4, "pipeline_parallel_interleave_num": 2,
                             "pipeline_parallel_enable_dxdw_split": True, "pipeline_parallel_overlap_p2p": True,
                             "pipeline_parallel_layers_per_stage": [1, 1, 1, 1, 1, 1, 1, 1]}, 4)
    spec = layout.pipeline
    assert (spec.schedule, spec.chunks, spec.split_backward, spec.overlap_p2p) == ("interleaved_1f1b", 2, True, True)
    asked = []

    def place(layers_per_stage, pp, chunks, num_layers, schedule):
        asked.append((layers_per_stage, pp, chunks, num_layers, schedule))
        return [[i] for i in range(num_layers)]

    stages = layout.stage_layout(8, place)
    assert asked == [([1] * 8, 4, 2, 8, "interleaved_1f1b")] and stages.chunks(1)[1].layers == (5,)


def test_context_parallel_settings_as_they_run():
    layout = Layout.resolve({"context_parallel": 4, "context_parallel_method": "hybrid", "ulysses_degree_in_cp": 2,
                             "context_parallel_async": True}, 4, "Ascend")
    assert layout.context == mp.ContextParallelSettings("hybrid", 2, "causal", True) and layout.idle == ()
    # Ulysses has no ring to overlap and spans every cp rank: both knobs idle, held at their defaults
    layout = Layout.resolve({"context_parallel": 2, "context_parallel_method": "ulysses", "context_parallel_async": True,
                             "ulysses_degree_in_cp": 1}, 2, "Ascend")
    assert layout.context == mp.ContextParallelSettings("ulysses")
    assert set(idle(layout)) == {"context_parallel_async", "ulysses_degree_in_cp"}
    # colossal is a pure ring; on CPU's synchronous collectives the async ring keeps its order (said once)
    layout = Layout.resolve({"context_parallel": 2, "ulysses_degree_in_cp": 2, "context_parallel_async": True}, 2, "CPU")
    assert layout.context == mp.ContextParallelSettings("colossal", None, "causal", True)
    assert idle(layout)["context_parallel_async"].startswith("collectives are synchronous on device_target CPU")
    assert idle(layout)["ulysses_degree_in_cp"] == ("2: context_parallel_method 'colossal' is a pure ring, with no "
                                                    "Ulysses degree to act on")


def test_fsdp_options_and_the_reshard_policy_per_unit():
    layout = Layout.resolve({"reshard_after_forward_policy": "default", "disable_gradient_division": False}, 4)
    assert layout.fsdp == mp.FsdpOptions("optim_grads_params", "default", False, False)
    assert layout.reshard_after_forward(last=False) and not layout.reshard_after_forward(last=True)
    staged = Layout.resolve({"pipeline_parallel": 2}, 4)
    assert not staged.reshard_after_forward(last=False)        # each micro-batch would gather again
    assert Layout.resolve({"reshard_after_forward_policy": "always", "pipeline_parallel": 2}, 4) \
        .reshard_after_forward(last=True)
    assert Layout.resolve({"cpu_offload": True}, 4).fsdp.cpu_offload          # device unknown: as declared


def test_dispatcher_options():
    layout = Layout.resolve({"expert_parallel": 4, "moe_token_dispatcher_type": "alltoall_deredundancy",
                             "npu_nums_per_device": 2}, 4)
    assert layout.dispatcher == mp.DispatcherOptions("alltoall_deredundancy", 2) and layout.idle == ()
    layout = Layout.resolve({"expert_parallel": 2, "npu_nums_per_device": 2}, 2)
    assert layout.dispatcher == mp.DispatcherOptions("alltoall")
    assert idle(layout) == {"npu_nums_per_device": "2 only acts with moe_token_dispatcher_type 'alltoall_deredundancy': "
                                                   "nothing to act on with 'alltoall'"}


# ----------------------------------------------------------------------------- idle fields
IDLE = [
    ({"pipeline_parallel_schedule": "zbv"}, 1, "CPU",
     "pipeline_parallel_schedule: 'zbv' only acts with pipeline_parallel > 1: nothing to act on in this layout"),
    ({"pipeline_parallel_interleave_num": 2}, 1, "CPU", "pipeline_parallel_interleave_num: 2 only acts with "
                                                        "pipeline_parallel > 1"),
    ({"context_parallel_method": "ulysses"}, 1, "CPU", "context_parallel_method: 'ulysses' only acts with "
                                                       "context_parallel > 1"),
    ({"moe_token_dispatcher_type": "alltoall_deredundancy"}, 2, None,
     "moe_token_dispatcher_type: 'alltoall_deredundancy' only acts with expert_parallel > 1"),
    ({"npu_nums_per_device": 4}, 2, None, "npu_nums_per_device: 4 only acts with expert_parallel > 1 and "
                                          "moe_token_dispatcher_type 'alltoall_deredundancy'"),
    ({"cpu_offload": True}, 2, "CPU", "cpu_offload: parameters and optimizer states already live in host memory"),
    ({"reshard_after_forward_policy": "always"}, 1, None, "reshard_after_forward_policy: 'always' only acts with "
                                                          "data parallelism over several ranks; this layout has none"),
    ({"tensor_parallel": 2, "disable_gradient_division": False}, 2, None,
     "disable_gradient_division: False only acts with data parallelism over several ranks"),
    ({"data_parallel_shard_strategy": "no_shard"}, 1, None, "data_parallel_shard_strategy: 'no_shard' only acts with "
                                                            "data parallelism"),
    ({"sequence_parallel": True}, 2, None, "sequence_parallel: true: sequence parallelism follows tensor_parallel, "
                                          "which is 1 here"),
]


@pytest.mark.parametrize("block, world, device, line", IDLE, ids=[c[3].split(":")[0] for c in IDLE])
def test_a_field_with_nothing_to_act_on_is_idle_and_acts_as_its_default(block, world, device, line):
    layout = Layout.resolve(block, world, device)
    lines = [i.line() for i in layout.idle]
    assert len(lines) == 1 and lines[0].startswith("parallelism." + line), lines
    default = Layout.resolve({k: v for k, v in block.items() if k == "tensor_parallel"}, world, device)
    assert (layout.fsdp, layout.pipeline, layout.context, layout.dispatcher) == \
        (default.fsdp, default.pipeline, default.context, default.dispatcher)
    assert layout.sequence_parallel == default.sequence_parallel


def test_without_a_world_the_world_split_is_unknown():
    layout = Layout.resolve({"tensor_parallel": 2, "reshard_after_forward_policy": "never"})
    assert layout.dims is None and layout.tp == 2 and layout.sequence_parallel and layout.idle == ()
    assert layout.describe() == "tp=2 cp=1 pp=1 ep=1 (world not given)"


def test_for_dims_takes_the_world_split_as_given():
    dims = mp.ParallelDims(4, cp=2)
    layout = Layout.for_dims(dims, {"context_parallel_method": "ulysses"})
    assert layout.dims is dims and layout.context.method == "ulysses"
    with pytest.raises(ParallelConfigError, match=r"^parallelism.context_parallel: 4 disagrees with the world split"):
        Layout.for_dims(dims, {"context_parallel": 4})


def test_changed_fields():
    assert mp.changed_fields({"tensor_parallel": 2, "context_parallel": 1, "sequence_parallel": True}) == \
        {"tensor_parallel": 2, "sequence_parallel": True}


def test_the_layout_imports_no_mindspore():
    code = ("import sys, mf_parallel as mp\n"
            "mp.Layout.resolve({'tensor_parallel': 2, 'pipeline_parallel': 2, 'expert_parallel': 2, "
            "'moe_token_dispatcher_type': 'alltoall_deredundancy', 'npu_nums_per_device': 2}, 8, 'CPU')\n"
            "assert not any(m.split('.')[0] == 'mindspore' for m in sys.modules), 'mindspore imported'\n"
            "print('clean')")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "clean", run.stderr
