"""Memory features, monitors and the profiler: what the Trainer honours. A memory or telemetry
field with nothing to act on here (recompute_comm without tensor parallelism, a profiler option
this device does not record, a profile window past the last step) is accepted with one notice
line; a name that selects nothing that exists is refused."""

from __future__ import annotations

import dataclasses

import mf_parallel as mp
from mf_trainer.preflight.parallel import changed
from mf_trainer.preflight.registry import Notice, check


@check()
def recompute_comm(t):
    """recompute_comm: what there is to recompute on this layout, and which names select it."""
    import mf_models

    rc = t.cfg.recompute_comm
    if not rc.enable:
        return
    tp = t.cfg.parallelism.tensor_parallel
    idle = (t.world is not None and t.world <= 1) or tp <= 1     # nothing to recompute: only typos matter
    if t.world is not None and t.world <= 1:
        yield Notice("recompute_comm.enable", "recomputes communication operators; a single-process run has none to "
                                              "recompute")
    elif tp <= 1:
        yield Notice("recompute_comm.enable", "recomputes the tensor-parallel (sequence-parallel) all-gathers, and "
                                              "tensor_parallel is 1: there are none here (FSDP's parameter gathers are "
                                              "redone in backward by reshard_after_forward_policy)")
    for key in rc.select_module or {}:
        where = f"recompute_comm.select_module['{key}']"
        if key not in mf_models.RECOMPUTE_COMM_MODULES:
            yield where, (f"names no sequence-parallel all-gather; choose from "
                          f"{', '.join(mf_models.RECOMPUTE_COMM_MODULES)}")
        elif (not idle and t.cfg.model.model_type == "deepseek_v3"
              and mf_models.RECOMPUTE_COMM_MODULES[key] == "attention"):
            yield where, ("not implemented for deepseek_v3's MLA attention (its low-rank projections read the "
                          "gathered input itself); select feed_forward of its dense layers only")


@check()
def swap(t):
    """swap: its fields act with enable (and free memory off CPU); op_swap names a module of each layer."""
    import mf_config
    import mf_models
    from mf_trainer.preflight.registry import split_line

    sw = t.cfg.swap
    if not sw.enable:
        for name in ("layer_swap", "op_swap", "default_prefetch"):
            if changed(sw, name):
                yield Notice(f"swap.{name}", "set while swap.enable is false: nothing to act on")
        return
    if t.device == "CPU":
        yield Notice("swap.enable", "device_target CPU keeps activations in host memory: the selected ones are still "
                                    "copied out and back, but nothing is freed and default_prefetch has no transfer "
                                    "to hide")
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
            module = mf_models.module_in_layer(entry.op_name, modules)
            if module is None:
                yield (f"swap.op_swap[{i}].op_name", f"{entry.op_name!r} is not a module of layer {layer}; its modules "
                       f"are {', '.join(modules)} (or MindFormers' names for them: "
                       f"{', '.join(mf_models.LAYER_MODULE_ALIASES)})")
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


@check(commands=("train",))
def hang_watchdog(t):
    """training.hang_timeout_s: the watchdog is mf launch's."""
    timeout = t.cfg.training.hang_timeout_s
    if changed(t.cfg.training, "hang_timeout_s") and not mp.watched_by_launcher():
        yield Notice("training.hang_timeout_s", f"{timeout:g} s: the hang watchdog is mf launch's (its launcher watches "
                                                "every rank's heartbeat); a run started without it has none")


@check()
def profiler(t):
    """Profiler fields act with enable_profiling; the window is cut at training.steps."""
    prof = t.cfg.profiler
    if not prof.enable_profiling:
        for f in dataclasses.fields(prof):
            if f.name != "enable_profiling" and changed(prof, f.name):
                yield Notice(f"profiler.{f.name}", "set while profiler.enable_profiling is false: nothing to act on")
        return
    if t.cfg.run_mode not in ("train", "finetune"):
        return
    steps = t.cfg.training.steps
    if prof.start_step > steps:
        yield Notice("profiler.start_step", f"{prof.start_step} is after the last step ({steps}): nothing is profiled")
    elif prof.end_step > steps:
        yield Notice("profiler.end_step", f"{prof.end_step} is after the last step ({steps}): the profile ends there")


# Profiler options and what device_target CPU records of them (measured with MindSpore 2.10.0's
# Profiler: profile_memory writes the allocator's record on CPU too; the level, mstx markers and
# Python stacks add nothing to a CPU profile).
_NOT_ON_CPU = {"profiler_level": "the detail levels select Ascend kernel and AI Core data",
               "mstx": "the mstx markers are recorded by the Ascend toolkit",
               "with_stack": "call stacks are collected with Ascend activity"}


@check(needs=("device",))
def profiler_device(t):
    """Profiler options this device records (the others: a notice each)."""
    prof = t.cfg.profiler
    if not prof.enable_profiling or t.device != "CPU":
        return
    for name, why in _NOT_ON_CPU.items():
        if changed(prof, name) or (name == "with_stack" and prof.with_stack):
            yield Notice(f"profiler.{name}", f"{getattr(prof, name)!r}: {why}; a device_target CPU profile has nothing "
                                             "of it to record")
    if not prof.profile_cpu:
        yield Notice("profiler.profile_cpu", "false: on device_target CPU the CPU activity is all there is, so nothing "
                                             "is profiled")


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
