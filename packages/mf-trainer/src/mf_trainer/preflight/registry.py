"""The preflight's machinery: what is checked (`Target`), the check registry, and the report.

A check is a function `fn(target) -> iterable of (key, message)` registered with `@check(...)`:
it says which commands it applies to and whether it needs the world size, the device and/or the
files. A check may also yield a `Notice(key, message)`: the one policy for a field that cannot act
is to refuse what cannot be done anywhere or would change the results (a problem), and to accept a
speed, memory or telemetry knob that has nothing to act on in this device or layout with exactly
one line naming it and why (a notice: `report.notices`, logged once by the run, printed by the
dry run and `mf config validate`). When the caller does not know one of those (`mf config validate` without `--world` /
`--device`, or with `--no-files`), the checks needing it are not run and are listed in
`PreflightReport.skipped` instead. Each check returns every independent problem it finds; checks
never raise for bad input.

`needs=("files",)` checks look at this machine's filesystem, read only: whether output_dir and
checkpoint.save_path can be written, what they already hold (another run, this run to resume),
the datasets' token range. A missing input is not theirs to report (the loader names it when it
opens the data), and `plan_only` callers (`mf config validate`, `mf train --dry-run`) make them
write no cache either.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from mf_trainer.errors import TrainerConfigError

Problem = tuple[str, str]  # (key path, reason)


class Notice(NamedTuple):
    """Accepted, said once: a speed, memory or telemetry knob with nothing to act on here."""

    key: str
    reason: str

    def line(self) -> str:
        return f"notice: {self.key}: {self.reason}"

# The commands a config can be checked for. `launch` is `mf launch` before msrun starts (the world
# is the one it is about to start); `train` is one process of a training run (alone, or a rank).
TRAIN, LAUNCH, EVAL, GENERATE, SERVE = "train", "launch", "eval", "generate", "serve"
COMMANDS = (TRAIN, LAUNCH, EVAL, GENERATE, SERVE)
TRAINING = (TRAIN, LAUNCH)
ONE_PROCESS = (EVAL, GENERATE, SERVE)
DEVICES = ("CPU", "Ascend")


def split_line(text: str, default_key: str) -> Problem:
    """A one-line error of another package ("key.path: reason") as (key, reason)."""
    line = str(text).strip().splitlines()[0] if str(text).strip() else default_key
    key, sep, reason = line.partition(": ")
    if not sep or " " in key:
        return default_key, line
    return key, reason


@dataclass
class Target:
    """What is asked: can `cfg` run as `command` on `device` with `world` ranks? (None = unknown.)
    `source` is the YAML's path, for messages that name a command to run instead."""

    cfg: Any
    command: str = TRAIN
    world: int | None = None
    device: str | None = None
    source: str | None = None
    files: bool = True           # False: the checks that read this machine's files are skipped
    overwrite: bool = False      # `--overwrite`: output_dir / save_path may hold something to remove
    plan_only: bool = False      # validate / dry run: not even a cache is written

    @functools.cached_property
    def dims(self):
        """The parallel layout for `world` (mf_parallel.ParallelDims), or None when the world is
        unknown or the degrees do not fit it (the layout check reports why)."""
        if self.world is None:
            return None
        import mf_parallel as mp
        from mf_trainer.preflight.parallel import effective_dims

        try:
            return effective_dims(self.cfg.parallelism, self.world)
        except (mp.ParallelConfigError, TrainerConfigError):
            return None

    @functools.cached_property
    def model_args(self):
        """The model's validated argument dataclass, or None when the section is invalid."""
        import mf_models

        try:
            return mf_models.build_args(model_section(self.cfg))[1]
        except mf_models.ModelConfigError:
            return None

    @property
    def config_name(self) -> str:
        return self.source or "CONFIG"

    @functools.cached_property
    def run_directory(self):
        """What output_dir / checkpoint.save_path hold for this config (mf_trainer.rundir)."""
        from mf_trainer.rundir import inspect_run

        return inspect_run(self.cfg, overwrite=self.overwrite)


def model_section(cfg) -> dict:
    section = {"model_type": cfg.model.model_type, "architectures": cfg.model.architectures, **cfg.model.extra}
    return {k: v for k, v in section.items() if v is not None}


@dataclass(frozen=True)
class Check:
    fn: Callable[[Target], Iterable[Problem]]
    commands: frozenset[str]
    needs: frozenset[str]        # subset of {"world", "device", "files"}
    gate: bool = False           # its problems make every later check moot (they are not run)

    @property
    def name(self) -> str:
        return self.fn.__name__

    @property
    def summary(self) -> str:
        return (self.fn.__doc__ or self.fn.__name__).strip().splitlines()[0].rstrip(".")


CHECKS: list[Check] = []


def check(*, commands: Iterable[str] = TRAINING, needs: Iterable[str] = (), gate: bool = False):
    """Register a check (decorator). Its docstring's first line names it in `skipped`. A `gate`
    check's problems end the preflight (e.g. a run_mode this command does not run: the command's
    other checks would only add noise)."""
    commands, needs = frozenset(commands), frozenset(needs)
    unknown = (commands - set(COMMANDS)) | (needs - {"world", "device", "files"})
    if unknown:
        raise ValueError(f"check: unknown commands/needs {sorted(unknown)}")

    def register(fn):
        CHECKS.append(Check(fn, commands, needs, gate))
        return fn

    return register


class PreflightError(TrainerConfigError):
    """Every problem the preflight found; the message is one `key: reason` line per problem."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        super().__init__("\n".join(f"{key}: {reason}" for key, reason in self.problems))


@dataclass
class PreflightReport:
    command: str
    world: int | None
    device: str | None
    problems: list[Problem] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)   # accepted knobs with nothing to act on here
    skipped: list[str] = field(default_factory=list)   # checks not run: "what (needs the world size)"

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def keys(self) -> list[str]:
        return [key for key, _ in self.problems]

    def lines(self) -> list[str]:
        return [f"{key}: {reason}" for key, reason in self.problems]

    def notice_lines(self) -> list[str]:
        return [notice.line() for notice in self.notices]

    def raise_for_problems(self) -> None:
        if self.problems:
            raise PreflightError(self.problems)


_NEEDS_TEXT = {"world": "the world size: --world N", "device": "the device: --device CPU|Ascend",
              "files": "this machine's files: drop --no-files"}
# Report order: what to run, the layout, the model, the data, the features, the device, the outputs.
TOPICS = ("run_mode", "parallel", "model", "data", "features", "device", "outputs")


def _topic(item: Check) -> int:
    name = item.fn.__module__.rsplit(".", 1)[-1]
    return TOPICS.index(name) if name in TOPICS else len(TOPICS)


def run_checks(target: Target) -> PreflightReport:
    if target.command not in COMMANDS:
        raise ValueError(f"preflight: unknown command {target.command!r}; one of {', '.join(COMMANDS)}")
    if target.device is not None and target.device not in DEVICES:
        raise ValueError(f"preflight: unknown device {target.device!r}; one of {', '.join(DEVICES)}")
    report = PreflightReport(target.command, target.world, target.device)
    known = {"world": target.world is not None, "device": target.device is not None, "files": target.files}
    seen: set[Problem] = set()
    for item in sorted(CHECKS, key=_topic):   # stable: registration order within a topic
        if target.command not in item.commands:
            continue
        missing = [n for n in sorted(item.needs) if not known[n]]
        if missing:
            report.skipped.append(f"{item.summary} (needs {' and '.join(_NEEDS_TEXT[n] for n in missing)})")
            continue
        found = list(item.fn(target) or ())
        for problem in found:
            if isinstance(problem, Notice):
                if problem not in report.notices:
                    report.notices.append(problem)
            elif problem not in seen:     # two checks may see one cause; say it once
                seen.add(problem)
                report.problems.append(problem)
        if item.gate and any(not isinstance(p, Notice) for p in found):
            break
    return report
