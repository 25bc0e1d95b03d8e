"""One preflight: can this config run with this command on this device at this world size?

    report = mf_trainer.preflight(cfg, command="train", world=2, device="CPU")
    report.problems          # [(key path, reason), ...]: every independent problem, not the first
    report.notices           # [Notice(key, reason), ...]: accepted knobs with nothing to act on here
    report.skipped           # checks not run because world / device were not given (None)
    report.raise_for_problems()   # PreflightError (a TrainerConfigError): one line per problem

Every refusal of a config that is not a parse error (mf-config's) lives here, so `mf config
validate`, `mf train [--dry-run]`, `mf launch` (before msrun starts), `mf eval`, `mf generate`,
`mf serve` and the Trainer's constructor can never disagree. No MindSpore (the model checks use
the model's argument classes). The `outputs` and data-range checks read files, never write them
(`files=False` skips them, `plan_only=True` keeps even mf-data's token-range cache unwritten).

Adding a check is one function in the topic module it belongs to:

    @check(commands=TRAINING, needs=("world",))
    def my_check(t):                      # t: Target (cfg, command, world, device, dims, model_args)
        \"\"\"What it checks (the line `skipped` shows).\"\"\"
        if ...:
            yield "section.key", "why it cannot run, and what to do"

Topics: parallel (layouts, strategies), pipeline (pipeline_parallel > 1), context (context parallelism),
model (keys, tensor-parallel splits), data (columns, evaluation split, batch arithmetic, token ids
against the vocabulary), features (memory, monitors, profiler, LR schedule), moe (the MoE monitor),
optimizer (type, pass-through keys, Muon's layouts), expert (expert parallelism), run_mode (commands, fine-tuning, inference
sample), device (context), outputs (output_dir and save_path writable; what they already hold:
resume, refuse, overwrite).
"""

from __future__ import annotations

# Importing a topic module registers its checks.
from mf_trainer.preflight import context, data, expert, features, model, outputs, parallel, pipeline, run_mode  # noqa: F401
from mf_trainer.preflight import device as _device  # noqa: F401
from mf_trainer.preflight import moe as _moe  # noqa: F401
from mf_trainer.preflight import optimizer as _optimizer  # noqa: F401
from mf_trainer.preflight.registry import (
    CHECKS,
    COMMANDS,
    ONE_PROCESS,
    TRAINING,
    Check,
    Notice,
    PreflightError,
    PreflightReport,
    Problem,
    Target,
    check,
    run_checks,
)


def preflight(cfg, command: str = "train", world: int | None = None, device: str | None = None, *,
              source: str | None = None, files: bool = True, overwrite: bool = False,
              plan_only: bool = False) -> PreflightReport:
    """Every problem of `cfg` for `command` ("train", "launch", "eval", "generate", "serve") on
    `device` ("CPU" / "Ascend") with `world` ranks; None leaves the checks needing it skipped.
    `source`: the YAML's path, named in messages that point to another command. `files`: look at
    this machine's files (outputs, data); `overwrite`: the run was given `--overwrite`;
    `plan_only`: a plan (validate, dry run) that must not write even a cache."""
    return run_checks(Target(cfg, command, world, device, source, files=files, overwrite=overwrite,
                             plan_only=plan_only))


__all__ = ["CHECKS", "COMMANDS", "ONE_PROCESS", "TRAINING", "Check", "Notice", "PreflightError", "PreflightReport", "Problem",
           "Target", "check", "preflight"]
