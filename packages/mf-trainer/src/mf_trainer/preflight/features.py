"""Memory features, monitors and the profiler: what the Trainer honours, and fields that only act
with another feature (refused when set without it, since they would do nothing)."""

from __future__ import annotations

import dataclasses

from mf_trainer.preflight.parallel import changed
from mf_trainer.preflight.registry import check


@check()
def recompute_comm(t):
    """recompute_comm: what there is to recompute on this layout, and which names select it."""
    import mf_models

    rc = t.cfg.recompute_comm
    if not rc.enable:
        return
    tp = t.cfg.parallelism.tensor_parallel
    if t.world is not None and t.world <= 1:
        yield "recompute_comm.enable", "recomputes communication operators; a single-process run has none"
    elif tp <= 1:
        yield ("recompute_comm.enable", "recomputes the tensor-parallel (sequence-parallel) all-gathers, and "
                                        "tensor_parallel is 1: there are none (FSDP's parameter gathers are redone "
                                        "in backward by reshard_after_forward_policy); set it to false")
    for key in rc.select_module or {}:
        where = f"recompute_comm.select_module['{key}']"
        if key not in mf_models.RECOMPUTE_COMM_MODULES:
            yield where, (f"names no sequence-parallel all-gather; choose from "
                          f"{', '.join(mf_models.RECOMPUTE_COMM_MODULES)}")
        elif t.cfg.model.model_type == "deepseek_v3" and mf_models.RECOMPUTE_COMM_MODULES[key] == "attention":
            yield where, ("not implemented for deepseek_v3's MLA attention (its low-rank projections read the "
                          "gathered input itself); select feed_forward of its dense layers only")


@check()
def swap(t):
    """swap: its fields act with enable, and op_swap names a module of each layer it lists."""
    import mf_config
    import mf_models
    from mf_trainer.preflight.registry import split_line

    sw = t.cfg.swap
    if not sw.enable:
        for name in ("layer_swap", "op_swap"):
            if getattr(sw, name) is not None:
                yield f"swap.{name}", "set while swap.enable is false: it would do nothing"
        if changed(sw, "default_prefetch"):
            yield "swap.default_prefetch", "set while swap.enable is false: it would do nothing"
        return
    args = t.model_args
    if args is None:
        return
    n = args.num_hidden_layers
    owner: dict[tuple[str, int], int] = {}     # mf's (module, layer): MindFormers' and mf's names may meet
    for i, entry in enumerate(sw.op_swap or []):
        try:
            layers = mf_config.parse_layer_spec(entry.layers, n, f"swap.op_swap[{i}].layers")
        except mf_config.ConfigError as exc:      # the model's layer count, when mf-config did not know it
            yield split_line(str(exc), f"swap.op_swap[{i}].layers")
            continue
        for layer in layers:
            modules = mf_models.layer_modules(args, layer)
            module = mf_models.layer_module_path(entry.op_name, modules)
            if module is None:
                yield (f"swap.op_swap[{i}].op_name", f"{entry.op_name!r} is not a module of layer {layer}; its modules "
                       f"are {', '.join(modules)} (MindFormers' names too: {', '.join(mf_models.MODULE_ALIASES)})")
                break
            if (module, layer) in owner:
                yield (f"swap.op_swap[{i}].op_name", f"{entry.op_name!r} is {module} in layer {layer}, already "
                       f"offloaded by swap.op_swap[{owner[module, layer]}]")
                break
            owner[module, layer] = i


@check()
def monitors(t):
    """Monitors the Trainer records."""
    from mf_trainer.errors import TrainerConfigError
    from mf_trainer.param_norms import compile_pattern
    from mf_trainer.preflight.registry import split_line

    mon = t.cfg.monitor      # monitor.moe_monitor: preflight/moe.py
    if mon.train_state.local_norm:   # the names it must match are checked when the model is built
        try:
            compile_pattern(mon.train_state.local_norm)
        except TrainerConfigError as exc:
            yield split_line(str(exc), "monitor.train_state.local_norm")


@check()
def profiler(t):
    """Profiler fields act with enable_profiling and fit training.steps."""
    prof = t.cfg.profiler
    if not prof.enable_profiling:
        for f in dataclasses.fields(prof):
            if f.name != "enable_profiling" and changed(prof, f.name):
                yield f"profiler.{f.name}", "set while profiler.enable_profiling is false: it would do nothing"
        return
    if prof.end_step > t.cfg.training.steps:
        yield "profiler.end_step", f"{prof.end_step} is beyond training.steps ({t.cfg.training.steps})"


@check(needs=("device",))
def profiler_device(t):
    """Profiler options exist on the device."""
    prof = t.cfg.profiler
    if not prof.enable_profiling or t.device != "CPU":
        return
    for name in ("profiler_level", "mstx", "profile_memory"):
        if changed(prof, name):
            yield f"profiler.{name}", "is an Ascend-only profiler option; not available on device_target CPU"
    if not prof.profile_cpu:
        yield "profiler.profile_cpu", "false leaves nothing to profile on device_target CPU"


@check()
def lr_schedule(t):
    """The LR scheduler and its arguments."""
    from mf_trainer.errors import TrainerConfigError
    from mf_trainer.lr_schedulers import build_scheduler
    from mf_trainer.preflight.registry import split_line

    sch = t.cfg.lr_scheduler
    try:
        build_scheduler(sch.type, sch.learning_rate, sch.extra, total_steps=t.cfg.training.steps)
    except TrainerConfigError as exc:
        yield split_line(str(exc), "lr_scheduler")
