"""Where a training run writes, on this machine (read only; `needs=("files",)`): output_dir and
checkpoint.save_path can be created and written, and what they already hold lets this run go
ahead (a new run, this run resumed, or --overwrite) instead of mixing with or rotating away
another run (mf_trainer.rundir decides; this module only reports)."""

from __future__ import annotations

from mf_trainer.preflight.registry import TRAINING, check


@check(commands=TRAINING, needs=("files",))
def outputs_writable(t):
    """output_dir and checkpoint.save_path can be written."""
    import os

    from mf_trainer.rundir import file_in_the_way, writable_problem

    cfg = t.cfg
    problem = writable_problem(cfg.output_dir)
    if problem:
        yield "output_dir", problem
    else:
        for line in file_in_the_way(cfg.output_dir, cfg.monitor.tensorboard):
            yield "output_dir", line
    inside = os.path.abspath(cfg.checkpoint.save_path).startswith(os.path.abspath(cfg.output_dir) + os.sep)
    if cfg.checkpoint.enable_save and not (problem and inside):   # under a refused output_dir: said once
        problem = writable_problem(cfg.checkpoint.save_path)
        if problem:
            yield "checkpoint.save_path", problem


@check(commands=TRAINING, needs=("files",))
def run_directory(t):
    """output_dir and save_path hold nothing of another run (resume, or --overwrite)."""
    state = t.run_directory
    if state.problem:
        yield state.key, state.problem
