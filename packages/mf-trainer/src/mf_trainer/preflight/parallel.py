"""The `parallelism` section: what the layout resolves to (mf_parallel.Layout, no MindSpore), what
the Trainer honours of it, and the layout arithmetic against the world size.

The section is read in one place, `mf_parallel.Layout` (`Target.layout`: resolved once for the
command's world and device; the Trainer runs the very object the preflight checked). Its parts'
refusals are reported here and in the topic modules (pipeline.py: the schedule; context.py: the
cp settings; expert.py: the dispatcher), each as its own line.

Training commands honour FSDP/HSDP/DDP (`data_parallel_shard_strategy` optim_grads_params or
no_shard), tensor + sequence parallelism, context parallelism (preflight/context.py) and pipeline
parallelism (its own checks: preflight/pipeline.py) and expert parallelism (preflight/expert.py);
ZeRO-1/2 are refused with their reason. One-process commands (`mf eval`, `mf generate`, `mf serve`) take no layout at all.

The knobs of a strategy this layout does not use (a pipeline schedule at pipeline_parallel 1, FSDP's
resharding policy without data-parallel ranks, cpu_offload where host memory is all there is, ...)
change no result: the layout lists each as idle (`Layout.idle`, holding its default in what
runs), and each is accepted here with one notice line (registry.Notice), so one YAML runs on a
laptop CPU and on an Ascend cluster. A training YAML's layout read by a one-process command is
said the same way.
"""

from __future__ import annotations

import mf_parallel as mp
from mf_trainer.preflight.registry import LAUNCH, ONE_PROCESS, TRAIN, Notice, check, split_line

DEGREES = ("tensor_parallel", "context_parallel", "pipeline_parallel", "expert_parallel")
_ONE_PROCESS = "this command runs in one process"


def layout_problem(t, part: str):
    """The problem line of one part of the layout as (key, reason), or None."""
    line = t.layout_problems.get(part)
    return None if line is None else split_line(line, "parallelism")


@check()
def parallelism_fields(t):
    """The parallelism section's fields can be read (the layout resolves nothing otherwise)."""
    problem = layout_problem(t, "fields")
    if problem:
        yield problem


@check()
def idle_fields(t):
    """The fields with nothing to act on in this layout or on this device: a notice each."""
    if t.layout is None:
        return
    for idle in t.layout.idle:
        yield Notice(idle.key, idle.reason)


@check()
def shard_strategy(t):
    """data_parallel_shard_strategy is ZeRO-3 or DDP."""
    problem = layout_problem(t, "strategy")
    if problem:
        yield problem


@check(needs=("device",))
def cpu_offload(t):
    """parallelism.cpu_offload: nothing to offload to on CPU; not implemented on accelerators."""
    problem = layout_problem(t, "offload")
    if problem:
        yield problem


@check()
def lora_layers(t):
    """LoRA adapters sit on unsharded layers only."""
    if t.cfg.lora is not None and t.layout is not None and max(t.layout.tp, t.layout.cp, t.layout.pp,
                                                               t.layout.ep) > 1:
        yield ("lora", "adapters on sharded (tensor/expert/context/pipeline-parallel) layers are not implemented; "
                       "LoRA runs with data parallelism only")


@check(needs=("world",))
def layout(t):
    """The parallel degrees fit the world size."""
    if t.layout is None:
        return              # parallelism_fields says why
    if t.command == TRAIN and t.world == 1:
        found = False
        for key in ("tensor_parallel", "context_parallel", "pipeline_parallel", "data_parallel_shard"):
            degree = t.layout.fields[key]
            if degree > 1:
                found = True
                yield (f"parallelism.{key}", f"{degree} > 1 needs {degree} ranks; this process runs alone: start it "
                                             f"with `mf launch -n N` (N a multiple of {degree})")
        if found:
            return
    suffix = f" (mf launch starts {t.world} rank{'s' if t.world > 1 else ''})" if t.command == LAUNCH else ""
    problem = layout_problem(t, "dims")
    if problem:
        yield problem[0], problem[1] + suffix
    for part in ("reshard", "division"):       # values mf-config's schema already refuses
        problem = layout_problem(t, part)
        if problem:
            yield problem


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
    for name, value in mp.changed_fields(t.cfg.parallelism).items():
        if name in DEGREES or name == "data_parallel_shard":
            if value == 1:
                continue     # one shard: what one process holds anyway
            reason = f"{value}: {_ONE_PROCESS}, so the layout has nothing to act on"
        elif name == "cpu_offload":
            reason = f"true: {_ONE_PROCESS}, with no FSDP shards to offload"
        else:
            reason = f"{value!r}: {_ONE_PROCESS}, so it has nothing to act on"
        yield Notice(f"parallelism.{name}", reason)
