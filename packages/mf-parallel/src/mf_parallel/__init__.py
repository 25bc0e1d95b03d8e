"""MindSpore parallel runtime: device mesh, collectives, FSDP/HSDP, TP/SP, PP, CP, EP.

`Layout` (the `parallelism` section resolved once: the world split, the pipeline spec, the CP
settings, the FSDP and dispatcher options, the idle fields), `ParallelDims`, the error type, the
pipeline planning names (`resolve_pipeline`, `build_schedule`, `simulate_schedule`, ...) and
context parallelism's sequence layout, batch slicing and settings import without MindSpore;
everything else needs it. MindSpore takes seconds to import: the names under `TYPE_CHECKING`
below are imported on first use at run time (PEP 562, `_LAZY`), so readers and type checkers see
where each comes from while `import mf_parallel` stays cheap (the trainer's preflight resolves the
Layout without MindSpore).
"""

__version__ = "0.6.0"

from typing import TYPE_CHECKING

from mf_parallel.cp.layout import (
    masked_from_segments,
    segment_ids_from_actual_seq_len,
    segment_ids_from_attention_mask,
    slice_for_context_parallel,
    zigzag_indices,
)
from mf_parallel.cp.methods import ContextParallelSettings, check_context_parallel, context_parallel_problems
from mf_parallel.dims import AXES, GROUP_NAMES, ParallelDims
from mf_parallel.errors import ParallelConfigError
from mf_parallel.layout import (
    EP_DISPATCHERS,
    FIELDS,
    STRATEGIES,
    DispatcherOptions,
    FsdpOptions,
    Idle,
    Layout,
    LayoutCheck,
    changed_fields,
    deredundancy_problem,
    reshard_after_forward_for,
)

if TYPE_CHECKING:  # imported on first use at run time (`_LAZY`, the same table)
    from mf_parallel.autograd import (
        CopyToGroup,
        GatherFromGroup,
        GatherSplit,
        ReduceFromGroup,
        ReduceScatterToGroup,
        SplitToGroup,
    )
    from mf_parallel.backend import CAPABILITIES, Support, capability_table, graph_mode_blocker, init_distributed
    from mf_parallel.clip import GlobalNormClip, sum_of_squares
    from mf_parallel.collectives import (
        AllGather,
        AllReduce,
        AllToAll,
        AllToAllV,
        Broadcast,
        ReduceScatter,
        SendRecv,
        all_gather,
        all_reduce,
        all_to_all,
        barrier,
        broadcast,
        reduce_scatter,
        send_recv,
    )
    from mf_parallel.communicator import Communicator
    from mf_parallel.cp.exchange import RingExchange
    from mf_parallel.cp.methods import context_parallel_attention
    from mf_parallel.cp.ring import RingAttention
    from mf_parallel.cp.ulysses import HybridAttention, UlyssesAttention
    from mf_parallel.expert_deredundancy import (
        DeredundancyTokenDispatcher,
        routed_rows,
        two_level_groups,
    )
    from mf_parallel.expert_parallel import AllToAllTokenDispatcher, ExpertExchange, shard_experts
    from mf_parallel.fsdp import check_cpu_offload, fully_shard
    from mf_parallel.grad_sync import DeferredSyncs, GradientSync, defer_gradient_syncs
    from mf_parallel.heartbeat import Heartbeat, start_heartbeat, watched_by_launcher
    from mf_parallel.launcher import launch, node_log_dir
    from mf_parallel.leaf import linear_terms_problem, register_linear_terms, register_param_forward
    from mf_parallel.loss import LinearCrossEntropy, VocabParallelArgmax, VocabParallelCrossEntropy
    from mf_parallel.mesh import DeviceMesh, Group, init_mesh, make_group
    from mf_parallel.pipeline import (
        Costs,
        PipelineExecutor,
        PipelineSpec,
        Placement,
        Schedule,
        ScheduleError,
        StageLayout,
        StepResult,
        WeightGradStash,
        build_schedule,
        defer_weight_grads,
        register_weight_grad_split,
        resolve_pipeline,
        simulate_schedule,
        text_timeline,
        validate_schedule,
    )
    from mf_parallel.prefetch import GatherPrefetcher, GatherSource, enable_gather_prefetch, gather_prefetch_pays_off
    from mf_parallel.scatter_buckets import GradientBucketer, enable_gradient_buckets
    from mf_parallel.state import (
        ParamLayout,
        gather_full_state,
        load_full_state,
        load_sharded_state,
        local_blocks,
        param_layouts,
        shard_metadata,
    )
    from mf_parallel.stats import CommStats, comm_stats
    from mf_parallel.tensor_parallel import (
        ColwiseParallel,
        ParallelStyle,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        VocabParallelEmbedding,
        local_heads,
        parallelize_module,
    )

# LinearCrossEntropy's default: logits of one chunk at most this large (float32 bytes; a few such
# buffers exist at once); here, without MindSpore, for memory estimates. 32 MiB = 256 tokens of a
# 32000-word vocabulary.
LINEAR_CE_CHUNK_BYTES = 32 * 2**20

_PIPELINE = ("PipelineSpec", "Placement", "StageLayout", "resolve_pipeline", "build_schedule",
             "validate_schedule", "simulate_schedule", "Costs", "Schedule", "ScheduleError", "text_timeline",
             "PipelineExecutor", "StepResult", "register_weight_grad_split", "defer_weight_grads",
             "WeightGradStash")

__all__ = [
    "__version__", "LINEAR_CE_CHUNK_BYTES", "AXES", "EP_DISPATCHERS", "GROUP_NAMES", "ParallelDims", "ParallelConfigError",
    # the resolved parallelism section (layout.py)
    "Layout", "LayoutCheck", "FsdpOptions", "DispatcherOptions", "Idle", "FIELDS", "STRATEGIES", "changed_fields",
    # context parallelism: the sequence layout and batch slicing (numpy), the settings and checks
    "zigzag_indices", "slice_for_context_parallel", "masked_from_segments", "segment_ids_from_attention_mask",
    "segment_ids_from_actual_seq_len", "ContextParallelSettings", "check_context_parallel",
    "context_parallel_problems",
    # mesh and backend
    "DeviceMesh", "Group", "init_mesh", "make_group", "init_distributed", "CAPABILITIES", "Support", "capability_table",
    "graph_mode_blocker",
    # collectives
    "AllReduce", "AllGather", "ReduceScatter", "AllToAll", "AllToAllV", "Broadcast", "SendRecv",
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv", "barrier",
    "CommStats", "comm_stats",
    # autograd-aware collectives
    "CopyToGroup", "ReduceFromGroup", "GatherFromGroup", "ReduceScatterToGroup", "SplitToGroup", "GatherSplit",
    # strategies
    "register_param_forward", "ParallelStyle", "ColwiseParallel", "RowwiseParallel", "VocabParallelEmbedding",
    "SequenceParallel", "PrepareModuleInput", "parallelize_module", "local_heads", "VocabParallelCrossEntropy",
    "VocabParallelArgmax", "LinearCrossEntropy", "register_linear_terms",
    "linear_terms_problem",
    "defer_gradient_syncs", "GradientSync", "DeferredSyncs", "enable_gradient_buckets", "GradientBucketer",
    "fully_shard", "reshard_after_forward_for", "check_cpu_offload", "GlobalNormClip", "sum_of_squares",
    "enable_gather_prefetch", "gather_prefetch_pays_off", "GatherPrefetcher", "GatherSource",
    "context_parallel_attention", "RingAttention", "UlyssesAttention", "HybridAttention", "RingExchange",
    "shard_experts", "AllToAllTokenDispatcher", "ExpertExchange", "DeredundancyTokenDispatcher", "two_level_groups",
    "deredundancy_problem", "routed_rows",
    # state
    "ParamLayout", "param_layouts", "shard_metadata", "local_blocks", "gather_full_state", "load_full_state",
    "load_sharded_state",
    # launching (per-node logs, the ranks' heartbeat the launcher watches) and the checkpoint collective interface
    "launch", "node_log_dir", "Heartbeat", "start_heartbeat", "watched_by_launcher", "Communicator",
    # pipeline parallelism (mf_parallel.pipeline: pure Python except the executor)
    "PipelineSpec", "Placement", "StageLayout", "resolve_pipeline", "build_schedule",
    "validate_schedule", "simulate_schedule", "Costs", "Schedule", "ScheduleError", "text_timeline",
    "PipelineExecutor", "StepResult", "register_weight_grad_split", "defer_weight_grads", "WeightGradStash",
]

# name -> module: the TYPE_CHECKING imports above, for run time (tests/test_package.py checks that the
# two say the same).
_LAZY = {
    "DeviceMesh": "mesh", "Group": "mesh", "init_mesh": "mesh", "make_group": "mesh",
    "init_distributed": "backend", "CAPABILITIES": "backend", "Support": "backend", "capability_table": "backend",
    "graph_mode_blocker": "backend",
    **{name: "collectives" for name in ("AllReduce", "AllGather", "ReduceScatter", "AllToAll", "AllToAllV", "Broadcast",
                                        "SendRecv", "all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                        "broadcast", "send_recv", "barrier")},
    "CommStats": "stats", "comm_stats": "stats",
    **{name: "autograd" for name in ("CopyToGroup", "ReduceFromGroup", "GatherFromGroup", "ReduceScatterToGroup",
                                     "SplitToGroup", "GatherSplit")},
    "register_param_forward": "leaf", "register_linear_terms": "leaf",
    "linear_terms_problem": "leaf",
    **{name: "tensor_parallel" for name in ("ParallelStyle", "ColwiseParallel", "RowwiseParallel",
                                            "VocabParallelEmbedding", "SequenceParallel", "PrepareModuleInput",
                                            "parallelize_module", "local_heads")},
    "VocabParallelCrossEntropy": "loss", "VocabParallelArgmax": "loss", "LinearCrossEntropy": "loss",
    **{name: "grad_sync" for name in ("defer_gradient_syncs", "GradientSync", "DeferredSyncs")},
    "enable_gradient_buckets": "scatter_buckets", "GradientBucketer": "scatter_buckets",
    "fully_shard": "fsdp", "check_cpu_offload": "fsdp",
    "GlobalNormClip": "clip", "sum_of_squares": "clip",
    **{name: "prefetch" for name in ("enable_gather_prefetch", "gather_prefetch_pays_off", "GatherPrefetcher",
                                     "GatherSource")},
    "context_parallel_attention": "cp.methods", "RingAttention": "cp.ring", "UlyssesAttention": "cp.ulysses",
    "HybridAttention": "cp.ulysses", "RingExchange": "cp.exchange",
    **{name: "expert_parallel" for name in ("shard_experts", "AllToAllTokenDispatcher", "ExpertExchange")},
    **{name: "expert_deredundancy" for name in ("DeredundancyTokenDispatcher", "two_level_groups",
                                                "routed_rows")},
    **{name: "state" for name in ("ParamLayout", "param_layouts", "shard_metadata", "local_blocks",
                                  "gather_full_state", "load_full_state", "load_sharded_state")},
    "launch": "launcher", "node_log_dir": "launcher", "Heartbeat": "heartbeat", "start_heartbeat": "heartbeat",
    "watched_by_launcher": "heartbeat",
    "Communicator": "communicator",
    **{name: "pipeline" for name in _PIPELINE},
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mf_parallel' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"mf_parallel.{module}"), name)
    globals()[name] = value
    return value
