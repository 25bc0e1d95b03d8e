"""What this Trainer honours, and a one-line refusal for everything it cannot honour here.

A field is either used or refused before any work starts: no silent no-ops. The checks depend on
the device (CPU / Ascend) and on the world size: the parallel layout itself (degrees, FSDP knobs,
sharding strategy, cpu_offload) is checked against the world in `parallel.build_dims`. Fields
that only mean something when another feature is on (e.g. FSDP knobs with no FSDP, pipeline knobs
without pipeline parallelism) are refused when set to a non-default value, with the reason; their
defaults are accepted.

Honoured elsewhere (not checked here): the checkpoint section (mf-ckpt), train_dataset (mf-data
rejects what it cannot do), model (mf-models), optimizer, lr_scheduler, callbacks, recompute
(`Cell.recompute()` on the named layers/modules, graph and PyNative), profiler (mindspore.Profiler
over [start_step, end_step]), monitor.log_interval / tensorboard / peak_flops_per_device, the
train_state monitors (see `monitor_columns`), inference + tokenizer (a sample at the end),
run_mode finetune + lora (finetune.py), eval_dataset (evaluation.py).
"""

from __future__ import annotations

import dataclasses

from mf_trainer.errors import TrainerConfigError
from mf_trainer.finetune import check_config as check_finetune

# parallelism fields that only act with a given feature on; (field, what turns it on). The FSDP
# knobs are checked against the actual layout in parallel.build_dims; the others belong to
# features that are not implemented (their degrees are refused there too).
_PARALLEL_DEPENDENT = {
    "context_parallel_method": "context_parallel > 1",
    "context_parallel_async": "context_parallel > 1",
    "ulysses_degree_in_cp": "context_parallel > 1",
    "context_parallel_mask_type": "context_parallel > 1",
    "pipeline_parallel_layers_per_stage": "pipeline_parallel > 1",
    "pipeline_parallel_schedule": "pipeline_parallel > 1",
    "pipeline_parallel_interleave_num": "pipeline_parallel > 1",
    "pipeline_parallel_overlap_p2p": "pipeline_parallel > 1",
    "pipeline_parallel_overlap_b_f": "pipeline_parallel > 1",
    "pipeline_parallel_enable_dxdw_split": "pipeline_parallel > 1",
    "moe_token_dispatcher_type": "expert_parallel > 1",
    "npu_nums_per_device": "expert_parallel > 1 on Ascend",
}
FSDP_KNOBS = ("data_parallel_shard_strategy", "reshard_after_forward_policy", "disable_gradient_division")
_DEGREES = ("tensor_parallel", "context_parallel", "pipeline_parallel", "expert_parallel")
_ONE_PROCESS = "this command runs in one process"


def _defaults(section) -> object:
    return type(section)()


def _changed(section, name: str) -> bool:
    return getattr(section, name) != getattr(_defaults(section), name)


def _refuse(path: str, reason: str):
    raise TrainerConfigError(f"{path}: {reason}")


def check_parallelism(cfg, device: str, world_size: int) -> None:
    """One-process commands (`mf eval`): no parallel layout at all."""
    par = cfg.parallelism
    if world_size > 1:
        _refuse("parallelism", f"this process is one of {world_size} ranks; {_ONE_PROCESS}")
    for name in _DEGREES:
        if getattr(par, name) > 1:
            _refuse(f"parallelism.{name}", f"{getattr(par, name)} > 1 needs {getattr(par, name)} ranks; {_ONE_PROCESS}")
    if par.data_parallel_shard not in (-1, 1):
        _refuse("parallelism.data_parallel_shard", f"{par.data_parallel_shard} ranks requested; {_ONE_PROCESS}")
    if par.cpu_offload:
        _refuse("parallelism.cpu_offload", "offloads FSDP shards to host memory; a single-process run has no "
                                           "shards" + (" and on CPU everything is in host memory already"
                                                       if device == "CPU" else ""))
    for name in (*FSDP_KNOBS, *_PARALLEL_DEPENDENT):
        if _changed(par, name):
            _refuse(f"parallelism.{name}", f"{getattr(par, name)!r} only acts with several ranks; {_ONE_PROCESS} "
                                           "(leave it at its default)")


def check_parallel_training(cfg) -> None:
    """The Trainer: layouts are checked by `parallel.build_dims` (degrees, FSDP knobs against the
    layout, strategies, cpu_offload); here the knobs of features that are not implemented."""
    par = cfg.parallelism
    for name, needs in _PARALLEL_DEPENDENT.items():
        if _changed(par, name):
            _refuse(f"parallelism.{name}", f"{getattr(par, name)!r} only acts with {needs}, which is not implemented "
                                           "(leave it at its default)")


def check_memory_features(cfg, device: str, world_size: int) -> None:
    if cfg.recompute_comm.enable:
        _refuse("recompute_comm.enable", "recomputes communication operators; " + (
            "not implemented (FSDP's reshard_after_forward_policy already gathers parameters again in the "
            "backward)" if world_size > 1 else "a single-process run has none"))
    if cfg.swap.enable:
        reason = ("activations already live in host memory on CPU" if device == "CPU"
                  else "activation offload is not implemented yet")
        _refuse("swap.enable", f"not supported on device_target {device}: {reason}")
    for name in ("layer_swap", "op_swap"):
        if getattr(cfg.swap, name) is not None and not cfg.swap.enable:
            _refuse(f"swap.{name}", "set while swap.enable is false: it would do nothing")


def check_monitor(cfg) -> None:
    mon = cfg.monitor
    if mon.moe_monitor.save_tokens_per_expert_interval is not None or mon.moe_monitor.target_layers is not None:
        _refuse("monitor.moe_monitor", "tokens-per-expert recording is not implemented yet (mf-models does not "
                                       "expose routing counts)")
    if mon.train_state.local_norm:
        _refuse("monitor.train_state.local_norm", "per-parameter gradient norms are not implemented yet")


def check_profiler(cfg, device: str) -> None:
    prof = cfg.profiler
    if not prof.enable_profiling:
        changed = [f.name for f in dataclasses.fields(prof) if f.name != "enable_profiling" and _changed(prof, f.name)]
        if changed:
            _refuse(f"profiler.{changed[0]}", "set while profiler.enable_profiling is false: it would do nothing")
        return
    if prof.end_step > cfg.training.steps:
        _refuse("profiler.end_step", f"{prof.end_step} is beyond training.steps ({cfg.training.steps})")
    if device == "CPU":
        for name in ("profiler_level", "mstx", "profile_memory"):
            if _changed(prof, name):
                _refuse(f"profiler.{name}", "is an Ascend-only profiler option; not available on device_target CPU")
        if not prof.profile_cpu:
            _refuse("profiler.profile_cpu", "false leaves nothing to profile on device_target CPU")


# The command that runs each non-training mode.
OTHER_MODES = {"eval": "mf eval CONFIG", "predict": "mf generate CONFIG"}


def check_extensions(cfg) -> None:
    if cfg.run_mode not in ("train", "finetune"):
        _refuse("run_mode", f"{cfg.run_mode!r} is not a training mode: run it with `{OTHER_MODES[cfg.run_mode]}`")
    check_finetune(cfg)  # lora needs finetune; finetune needs load_path; no LoRA on sharded layers
    inf = cfg.inference
    if not (inf.prompts or inf.input_file):
        changed = [f.name for f in dataclasses.fields(inf) if _changed(inf, f.name)]
        if changed:
            _refuse(f"inference.{changed[0]}", "set without inference.prompts or input_file: nothing would be generated")
    elif not cfg.tokenizer.path:
        _refuse("tokenizer.path", "required to turn inference.prompts into tokens for the end-of-training sample")
    if cfg.tokenizer.path and cfg.tokenizer.type != "sentencepiece":
        _refuse("tokenizer.type", f"{cfg.tokenizer.type!r} tokenizers are not supported yet; use sentencepiece")


def check_context(cfg, device: str) -> None:
    if device == "CPU" and cfg.context.device_id != 0:
        _refuse("context.device_id", f"{cfg.context.device_id}: a CPU run has no device index (use 0)")


def check_supported(cfg, device: str, world_size: int = 1) -> None:
    """Raise TrainerConfigError for the first field this run cannot honour."""
    check_extensions(cfg)
    check_context(cfg, device)
    check_parallel_training(cfg)
    check_memory_features(cfg, device, world_size)
    check_monitor(cfg)
    check_profiler(cfg, device)
