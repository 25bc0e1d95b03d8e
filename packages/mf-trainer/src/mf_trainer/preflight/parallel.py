"""The `parallelism` section: what is implemented, which knobs act with which feature, and the
layout arithmetic against the world size (mf_parallel.ParallelDims, no MindSpore).

Training commands honour FSDP/HSDP/DDP (`data_parallel_shard_strategy` optim_grads_params or
no_shard), tensor + sequence parallelism, context parallelism (preflight/context.py) and pipeline
parallelism (its own checks: preflight/pipeline.py) and expert parallelism (preflight/expert.py);
ZeRO-1/2 are refused with their reason. One-process commands (`mf eval`, `mf generate`, `mf serve`) take no layout at all.

The knobs of a strategy this layout does not use (a pipeline schedule at pipeline_parallel 1, FSDP's
resharding policy without data-parallel ranks, cpu_offload where host memory is all there is, a
training YAML's layout read by a one-process command) change no result: each is accepted with one
notice line (registry.Notice), so one YAML runs on a laptop CPU and on an Ascend cluster.
"""

from __future__ import annotations

import mf_parallel as mp
from mf_trainer.errors import TrainerConfigError
from mf_trainer.preflight.registry import LAUNCH, ONE_PROCESS, TRAIN, Notice, check

# data_parallel_shard_strategy values the Trainer honours.
STRATEGIES = {
    "optim_grads_params": "parameters, gradients and optimizer states sharded (ZeRO-3)",
    "no_shard": "every data-parallel rank holds everything (DDP)",
}
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
def feature_knobs(t):
    """Knobs of a strategy this layout does not use change nothing (a notice each)."""
    par = t.cfg.parallelism
    for name, (degree, needs) in FEATURE_KNOBS.items():
        if changed(par, name) and getattr(par, degree) == 1:
            yield Notice(f"parallelism.{name}", f"{getattr(par, name)!r} only acts with {needs}: nothing to act on "
                                                "in this layout")


@check()
def sequence_parallel(t):
    """sequence_parallel follows tensor_parallel (on whenever tp > 1, as the reference has it)."""
    par = t.cfg.parallelism
    if par.sequence_parallel and par.tensor_parallel == 1:
        yield Notice("parallelism.sequence_parallel", "true: sequence parallelism follows tensor_parallel, which is 1 "
                                                      "here, so there is nothing to split")


@check()
def shard_strategy(t):
    """data_parallel_shard_strategy is ZeRO-3 or DDP."""
    strategy = t.cfg.parallelism.data_parallel_shard_strategy
    if strategy not in STRATEGIES:
        zero = 1 if strategy == "optim" else 2
        yield ("parallelism.data_parallel_shard_strategy",
               f"{strategy!r} (ZeRO-{zero}: sharded optimizer states{'' if zero == 1 else ' and gradients'} with "
               "replicated parameters) is not implemented; use 'optim_grads_params' (ZeRO-3) or 'no_shard' (DDP)")


@check()
def cpu_offload(t):
    """parallelism.cpu_offload: nothing to offload to on CPU; not implemented on accelerators."""
    if not t.cfg.parallelism.cpu_offload:
        return
    if t.device == "CPU":
        yield Notice("parallelism.cpu_offload", "parameters and optimizer states already live in host memory on "
                                                "device_target CPU: nothing to offload")
    elif t.device is not None:
        yield ("parallelism.cpu_offload", f"not supported by mf-parallel on {t.device} yet (no host-offloaded "
                                          "parameter or optimizer path is implemented); set it to false")


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
    """FSDP knobs act only with data parallelism (a notice each otherwise)."""
    dims = t.dims
    if dims is None or dims.fsdp_enabled or dims.dp_replicate > 1:
        return
    par = t.cfg.parallelism
    for key in FSDP_KNOBS:
        if changed(par, key) and not (key == "data_parallel_shard_strategy" and par.data_parallel_shard_strategy
                                      not in STRATEGIES):
            yield Notice(f"parallelism.{key}", f"{getattr(par, key)!r} only acts with data parallelism over several "
                                               f"ranks; this layout has none ({dims.describe()})")


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
    """Evaluation and generation run in one process: a layout in their own YAML changes no result."""
    if t.cfg.run_mode in ("train", "finetune"):
        return      # a training YAML's layout describes its training
    par = t.cfg.parallelism
    for name in DEGREES:
        if getattr(par, name) > 1:
            yield Notice(f"parallelism.{name}", f"{getattr(par, name)}: {_ONE_PROCESS}, so the layout has nothing to "
                                                "act on")
    if par.data_parallel_shard not in (-1, 1):
        yield Notice("parallelism.data_parallel_shard", f"{par.data_parallel_shard}: {_ONE_PROCESS}, so the layout "
                                                        "has nothing to act on")
    if par.cpu_offload:
        yield Notice("parallelism.cpu_offload", f"true: {_ONE_PROCESS}, with no FSDP shards to offload")
    for name in (*FSDP_KNOBS, *FEATURE_KNOBS):
        if changed(par, name):
            yield Notice(f"parallelism.{name}", f"{getattr(par, name)!r}: {_ONE_PROCESS}, so it has nothing to act on")
