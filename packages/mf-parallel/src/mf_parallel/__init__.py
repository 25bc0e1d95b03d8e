"""MindSpore parallel runtime: device mesh, collectives, FSDP/HSDP, TP/SP, PP, CP, EP.

`ParallelDims`, the error type, the pipeline planning names (`resolve_pipeline`,
`build_schedule`, `simulate_schedule`, ...) and context parallelism's sequence layout, batch
slicing and settings import without MindSpore; everything else needs it.
"""

__version__ = "0.6.0"

from mf_parallel.cp.layout import (
    masked_from_segments,
    segment_ids_from_actual_seq_len,
    segment_ids_from_attention_mask,
    slice_for_context_parallel,
    zigzag_indices,
)
from mf_parallel.cp.methods import ContextParallelSettings, check_context_parallel, context_parallel_problems
from mf_parallel.dims import AXES, EP_DISPATCHERS, GROUP_NAMES, ParallelDims
from mf_parallel.errors import ParallelConfigError

# LinearCrossEntropy's default: logits of one chunk at most this large (float32 bytes; a few such
# buffers exist at once); here, without MindSpore, for memory estimates. 32 MiB = 256 tokens of a
# 32000-word vocabulary.
LINEAR_CE_CHUNK_BYTES = 32 * 2**20

_PIPELINE = ("PipelineSpec", "Placement", "StageLayout", "resolve_pipeline", "pipeline_from_config", "build_schedule",
             "validate_schedule", "simulate_schedule", "Costs", "Schedule", "ScheduleError", "text_timeline",
             "PipelineExecutor", "StepResult", "register_weight_grad_split", "defer_weight_grads",
             "WeightGradStash")

__all__ = [
    "__version__", "LINEAR_CE_CHUNK_BYTES", "AXES", "EP_DISPATCHERS", "GROUP_NAMES", "ParallelDims", "ParallelConfigError",
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
    # launching and the checkpoint collective interface
    "launch", "Communicator",
    # pipeline parallelism (mf_parallel.pipeline: pure Python except the executor)
    *_PIPELINE,
]

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
    "fully_shard": "fsdp", "reshard_after_forward_for": "fsdp", "check_cpu_offload": "fsdp",
    "GlobalNormClip": "clip", "sum_of_squares": "clip",
    **{name: "prefetch" for name in ("enable_gather_prefetch", "gather_prefetch_pays_off", "GatherPrefetcher",
                                     "GatherSource")},
    "context_parallel_attention": "cp.methods", "RingAttention": "cp.ring", "UlyssesAttention": "cp.ulysses",
    "HybridAttention": "cp.ulysses", "RingExchange": "cp.exchange",
    **{name: "expert_parallel" for name in ("shard_experts", "AllToAllTokenDispatcher", "ExpertExchange")},
    **{name: "expert_deredundancy" for name in ("DeredundancyTokenDispatcher", "two_level_groups",
                                                "deredundancy_problem", "routed_rows")},
    **{name: "state" for name in ("ParamLayout", "param_layouts", "shard_metadata", "local_blocks",
                                  "gather_full_state", "load_full_state", "load_sharded_state")},
    "launch": "launcher", "Communicator": "communicator",
    **{name: "pipeline" for name in _PIPELINE},
}


def __getattr__(name: str):
    # MindSpore takes seconds to import: only the parts that need it pull it in.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mf_parallel' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"mf_parallel.{module}"), name)
    globals()[name] = value
    return value
