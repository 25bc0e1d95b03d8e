"""The `parallelism` section: what is implemented, which knobs act with which feature, and the
layout arithmetic against the world size (mf_parallel.ParallelDims, no MindSpore).

Training commands honour FSDP/HSDP/DDP (`data_parallel_shard_strategy` optim_grads_params or
no_shard), tensor + sequence parallelism, context parallelism (preflight/context.py) and pipeline
parallelism (its own checks: preflight/pipeline.py) and expert parallelism (preflight/expert.py);
ZeRO-1/2 are refused with their reason. One-process commands (`mf eval`, `mf generate`, `mf serve`) take no layout at all.
"""

from __future__ import annotations

import mf_parallel as mp
from mf_trainer.errors import TrainerConfigError
from mf_trainer.preflight.registry import LAUNCH, ONE_PROCESS, TRAIN, check

# data_parallel_shard_strategy values the Trainer honours.
STRATEGIES = {
    "optim_grads_params": "parameters, gradients and optimizer states sharded (ZeRO-3)",
    "no_shard": "every data-parallel rank holds everything (DDP)",
}
UNIMPLEMENTED: dict[str, str] = {}  # pipeline: preflight/pipeline.py, context: context.py, expert: expert.py
DEGREES = ("tensor_parallel", "context_parallel", "pipeline_parallel", "expert_parallel")
FSDP_KNOBS = ("data_parallel_shard_strategy", "reshard_after_forward_policy", "disable_gradient_division")
# Fields that only act with a feature: field -> (its degree, what turns it on).
FEATURE_KNOBS = {
    **{name: ("context_parallel", "context_parallel > 1") for name in (
        "context_parallel_method", "context_parallel_async", "ulysses_degree_in_cp", "context_parallel_mask_type")},
    **{name: ("pipeline_parallel", "pipeline_parallel > 1") for name in (
        "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule", "pipeline_parallel_interleave_num",
        "pipeline_parallel_overlap_p2p", "pipeline_parallel_overlap_b_f", "pipeline_parallel_enable_dxdw_split")},
    "moe_token_dispatcher_type": ("expert_parallel", "expert_parallel > 1"),
    "npu_nums_per_device": ("expert_parallel", "expert_parallel > 1 and moe_token_dispatcher_type "
                                               "'alltoall_deredundancy'"),
}
_ONE_PROCESS = "this command runs in one process"


def changed(section, name: str) -> bool:
    """The field differs from its default."""
    return getattr(section, name) != getattr(type(section)(), name)


def effective_dims(par, world: int) -> mp.ParallelDims:
    """The layout the Trainer runs for `world` ranks: ParallelDims.from_config, with `no_shard`
    turning the data-parallel ranks into replicas (DDP). Raises ParallelConfigError /
    TrainerConfigError (one line) when the degrees do not fit."""
    dims = mp.ParallelDims.from_config(par, world)
    if par.data_parallel_shard_strategy == "no_shard" and dims.dp_shard > 1:
        if par.data_parallel_shard > 1:
            raise TrainerConfigError(
                f"parallelism.data_parallel_shard: {par.data_parallel_shard} shards, but data_parallel_shard_strategy "
                "is 'no_shard'; leave data_parallel_shard at -1 or use 'optim_grads_params'")
        # (ep stays: with dp_shard 1 it no longer divides dp_shard x cp, and ParallelDims says so;
        # the expert check names no_shard itself.)
        dims = mp.ParallelDims(world, dp_replicate=dims.dp, dp_shard=1, cp=dims.cp, tp=dims.tp, pp=dims.pp, ep=dims.ep)
    return dims


@check()
def unimplemented_degrees(t):
    """Pipeline, context and expert parallelism are not implemented."""
    par = t.cfg.parallelism
    for key, what in UNIMPLEMENTED.items():
        if getattr(par, key) > 1:
            yield (f"parallelism.{key}", f"{getattr(par, key)} > 1 is not implemented ({what} parallelism has no "
                                         "strategy in mf-parallel yet); set it to 1")


@check()
def feature_knobs(t):
    """Knobs of features that are off (or not implemented) stay at their defaults."""
    par = t.cfg.parallelism
    for name, (degree, needs) in FEATURE_KNOBS.items():
        # With the feature's degree set, the degree's own refusal says it all.
        if changed(par, name) and getattr(par, degree) == 1:
            missing = ", which is not implemented" if degree in UNIMPLEMENTED else ""
            yield (f"parallelism.{name}", f"{getattr(par, name)!r} only acts with {needs}{missing} "
                                          "(leave it at its default)")


@check()
def shard_strategy(t):
    """data_parallel_shard_strategy is ZeRO-3 or DDP."""
    strategy = t.cfg.parallelism.data_parallel_shard_strategy
    if strategy not in STRATEGIES:
        zero = 1 if strategy == "optim" else 2
        yield ("parallelism.data_parallel_shard_strategy",
               f"{strategy!r} (ZeRO-{zero}: sharded optimizer states{'' if zero == 1 else ' and gradients'} with "
               "replicated parameters) is not implemented; use 'optim_grads_params' (ZeRO-3) or 'no_shard' (DDP)")


def _cpu_offload_reason(device: str | None) -> str:
    if device == "CPU":
        return ("means nothing on device_target CPU (parameters and optimizer states already live in host memory); "
                "set it to false")
    where = f"on {device}" if device else "on any device"
    return (f"not supported by mf-parallel {where} yet (no host-offloaded parameter or optimizer path is "
            "implemented); set it to false")


@check()
def cpu_offload(t):
    """parallelism.cpu_offload is not implemented."""
    if t.cfg.parallelism.cpu_offload:
        yield "parallelism.cpu_offload", _cpu_offload_reason(t.device)


@check()
def lora_layers(t):
    """LoRA adapters sit on unsharded layers only."""
    par = t.cfg.parallelism
    if t.cfg.lora is not None and any(getattr(par, k) > 1 for k in DEGREES):
        yield ("lora", "adapters on sharded (tensor/expert/context/pipeline-parallel) layers are not implemented; "
                       "LoRA runs with data parallelism only")


@check(needs=("world",))
def layout(t):
    """The parallel degrees fit the world size."""
    par = t.cfg.parallelism
    if any(getattr(par, key) > 1 for key in UNIMPLEMENTED):
        return      # refused already (unimplemented_degrees); the arithmetic would only repeat it
    if t.command == TRAIN and t.world == 1:
        found = False
        for key in ("tensor_parallel", "context_parallel", "pipeline_parallel", "data_parallel_shard"):
            degree = getattr(par, key)
            if degree > 1:
                found = True
                yield (f"parallelism.{key}", f"{degree} > 1 needs {degree} ranks; this process runs alone: start it "
                                             f"with `mf launch -n N` (N a multiple of {degree})")
        if found:
            return
    suffix = f" (mf launch starts {t.world} rank{'s' if t.world > 1 else ''})" if t.command == LAUNCH else ""
    try:
        effective_dims(par, t.world)
    except (mp.ParallelConfigError, TrainerConfigError) as exc:
        from mf_trainer.preflight.registry import split_line

        key, reason = split_line(str(exc), "parallelism")
        yield key, reason + suffix


@check(needs=("world",))
def fsdp_knobs(t):
    """FSDP knobs act only with data parallelism."""
    dims = t.dims
    if dims is None or dims.fsdp_enabled or dims.dp_replicate > 1:
        return
    par = t.cfg.parallelism
    for key in FSDP_KNOBS:
        if changed(par, key) and not (key == "data_parallel_shard_strategy" and par.data_parallel_shard_strategy
                                      not in STRATEGIES):
            yield (f"parallelism.{key}", f"{getattr(par, key)!r} only acts with data parallelism over several ranks; "
                                         f"this layout has none ({dims.describe()}): leave it at its default")


@check(needs=("world",))
def lora_ranks(t):
    """LoRA runs in one process."""
    if t.cfg.lora is not None and t.world > 1:
        yield ("lora", "LoRA over several ranks is not implemented (its adapter layers have no sharded forward in "
                       "mf-parallel); run the fine-tune in one process")


@check(commands=ONE_PROCESS, needs=("world",))
def one_process_world(t):
    """Evaluation and generation run in one process."""
    if t.world > 1:
        yield "parallelism", f"this process is one of {t.world} ranks; {_ONE_PROCESS}"


@check(commands=ONE_PROCESS)
def one_process_layout(t):
    """Evaluation and generation take no parallel layout (a training YAML's describes its training)."""
    if t.cfg.run_mode in ("train", "finetune"):
        return
    par = t.cfg.parallelism
    for name in DEGREES:
        if getattr(par, name) > 1:
            yield f"parallelism.{name}", f"{getattr(par, name)} > 1 needs {getattr(par, name)} ranks; {_ONE_PROCESS}"
    if par.data_parallel_shard not in (-1, 1):
        yield "parallelism.data_parallel_shard", f"{par.data_parallel_shard} ranks requested; {_ONE_PROCESS}"
    if par.cpu_offload:
        yield ("parallelism.cpu_offload", "offloads FSDP shards to host memory; a single-process run has no shards"
               + (" and on CPU everything is in host memory already" if t.device == "CPU" else ""))
    for name in (*FSDP_KNOBS, *FEATURE_KNOBS):
        if changed(par, name):
            yield (f"parallelism.{name}", f"{getattr(par, name)!r} only acts with several ranks; {_ONE_PROCESS} "
                                          "(leave it at its default)")
