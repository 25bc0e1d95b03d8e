"""Pipeline parallelism: stages, schedules as data, their validator and simulator, the executor.

Everything but the executor is pure Python (no MindSpore), so `mf plan` and the config checks
read the same schedules the executor runs:

    spec = resolve_pipeline(pp=4, schedule="1f1b", interleave_num=2, dxdw_split=True)
    schedule = build_schedule(spec, microbatches=8)      # every rank's action list
    validate_schedule(schedule)                          # F < B < W, matched p2p, no deadlock
    sim = simulate_schedule(schedule, Costs(F=1, B=1, W=1))
    sim.bubble_fraction, sim.peak_in_flight

`PipelineExecutor` (MindSpore, imported on first use) runs one rank's list.
"""

from mf_parallel.pipeline.actions import Combined, Comm, Compute, Message, Schedule
from mf_parallel.pipeline.dataflow import Costs
from mf_parallel.pipeline.render import save_png, text_timeline
from mf_parallel.pipeline.schedules import build_schedule, compute_orders, overlap_b_f_idle_reason
from mf_parallel.pipeline.simulate import Simulation, expected_bubble, textbook_bubble
from mf_parallel.pipeline.simulate import simulate as simulate_schedule
from mf_parallel.pipeline.stages import (
    SCHEDULES,
    ChunkInfo,
    PipelineSpec,
    Placement,
    StageLayout,
    pipeline_from_config,
    resolve_pipeline,
)
from mf_parallel.pipeline.validate import ScheduleError
from mf_parallel.pipeline.validate import validate as validate_schedule

__all__ = [
    "SCHEDULES", "ChunkInfo", "Combined", "Comm", "Compute", "Costs", "Message", "PipelineSpec", "Placement",
    "Schedule", "ScheduleError", "Simulation", "StageLayout", "build_schedule", "compute_orders", "expected_bubble",
    "overlap_b_f_idle_reason", "pipeline_from_config", "resolve_pipeline", "save_png", "simulate_schedule",
    "text_timeline", "textbook_bubble", "validate_schedule",
    # MindSpore (lazy)
    "PipelineExecutor", "StepResult", "defer_weight_grads", "register_weight_grad_split", "WeightGradStash",
]

_LAZY = {"PipelineExecutor": "executor", "StepResult": "executor",
         **{name: "weight_grad" for name in ("defer_weight_grads", "register_weight_grad_split", "WeightGradStash")}}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mf_parallel.pipeline' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"mf_parallel.pipeline.{module}"), name)
    globals()[name] = value
    return value
