"""The text summary of one run: steps, time, throughput, losses, skips, checkpoints, and what the reader noted.

Wall time is the sessions' (start record to last record, added up over resumes; start-up, data
preparation, evaluations and checkpoint writes included, the gap between a kill and the rerun
not), beside the sum of the recorded `step_time_s` (and `eval_time_s`). A file of mf-trainer < 0.5
has no wall clock: then only the sums are shown. The median throughput includes every step; the
first step of each process is one outlier the median ignores, which a mean would not.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from mf_cli.report.history import Checkpoint, RunHistory, step_ranges


@dataclass
class RunSummary:
    name: str
    path: str
    steps: int
    first_step: int | None
    last_step: int | None
    skipped: list[int]
    step_time_s: float
    eval_time_s: float
    wall_time_s: float | None
    sessions: int
    median_tokens_per_s: float
    median_mfu: float
    best_loss: tuple[float, int] | None      # (value, step) over finite training losses
    final_loss: tuple[float, int] | None     # the last step's loss (NaN when that step was skipped)
    best_eval_loss: tuple[float, int] | None
    final_eval_loss: tuple[float, int] | None
    last_checkpoint: Checkpoint | None
    checkpoint_steps: list[int]              # on disk
    rotated_steps: list[int]                 # recorded, then rotated away
    notes: list[str] = field(default_factory=list)


def _median(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.median(finite) if finite else math.nan


def _best(steps: list[int], values: list[float]) -> tuple[float, int] | None:
    finite = [(v, s) for s, v in zip(steps, values) if math.isfinite(v)]
    return min(finite, key=lambda p: (p[0], p[1])) if finite else None


def summarize(run: RunHistory) -> RunSummary:
    steps, losses = run.series("loss")
    eval_steps, eval_losses = run.series("eval_loss", evals=True)
    return RunSummary(
        name=run.name, path=str(run.path), steps=len(steps),
        first_step=steps[0] if steps else None, last_step=steps[-1] if steps else None,
        skipped=run.skipped_steps,
        step_time_s=math.fsum(v for v in run.series("step_time_s")[1] if math.isfinite(v)),
        eval_time_s=math.fsum(v for v in run.series("eval_time_s", evals=True)[1] if math.isfinite(v)),
        wall_time_s=run.wall_time, sessions=len(run.sessions),
        median_tokens_per_s=_median(run.series("tokens_per_s")[1]),
        median_mfu=_median(run.series("mfu")[1]),
        best_loss=_best(steps, losses), final_loss=(losses[-1], steps[-1]) if steps else None,
        best_eval_loss=_best(eval_steps, eval_losses),
        final_eval_loss=(eval_losses[-1], eval_steps[-1]) if eval_steps else None,
        last_checkpoint=run.last_checkpoint, checkpoint_steps=sorted({c.step for c in run.checkpoints if c.on_disk}),
        rotated_steps=sorted({c.step for c in run.checkpoints if not c.on_disk}),
        notes=reader_notes(run),
    )


def reader_notes(run: RunHistory) -> list[str]:
    """What the reader had to decide about the file, in words a user can act on."""
    notes = []
    if run.duplicate_steps:
        notes.append(f"duplicate records of step(s) {step_ranges(run.duplicate_steps)} in {run.metrics_path.name} "
                     "(a resume or rerun wrote them again): the latest record of each is used")
    for before, at in run.restarts:
        notes.append(f"the history restarts at step {at} after step {before}: the earlier records from step {at} on "
                     "are replaced by the later ones")
    if run.superseded_steps:
        notes.append(f"step(s) {step_ranges(run.superseded_steps)} of an earlier attempt were not written again "
                     "and are left out")
    if run.torn_last_line:
        notes.append("the last line is incomplete (the run is still writing it, or was killed mid-line): left out")
    if run.unknown_records:
        notes.append(f"{run.unknown_records} record(s) with neither 'loss' nor 'eval_loss' were not used")
    return [*notes, *run.notes]


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.2f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def _loss(pair: tuple[float, int] | None) -> str:
    return "-" if pair is None else f"{pair[0]:.4f} at step {pair[1]}"


def summary_lines(s: RunSummary) -> list[str]:
    """`name (path): ...` then indented detail lines, for the console."""
    if s.steps:
        span = f"steps {s.first_step}-{s.last_step} ({s.steps} recorded"
        span += f", {len(s.skipped)} skipped: {step_ranges(s.skipped)})" if s.skipped else ", 0 skipped)"
    else:
        span = "no training steps recorded"
    time = f"{_duration(s.step_time_s)} in steps" + (f" + {_duration(s.eval_time_s)} in evaluations"
                                                      if s.eval_time_s else "")
    if s.wall_time_s is not None:
        over = f" over {s.sessions} sessions" if s.sessions > 1 else ""
        time = f"wall time {_duration(s.wall_time_s)}{over} ({time})"
    rate = f"median {s.median_tokens_per_s:.4g} tokens/s" if math.isfinite(s.median_tokens_per_s) else "no tokens/s"
    if math.isfinite(s.median_mfu):
        rate += f", MFU {100.0 * s.median_mfu:.3g}%"
    lines = [f"{s.name} ({s.path}): {span}; {time}; {rate}"]
    loss = f"  loss: best {_loss(s.best_loss)}, final {_loss(s.final_loss)}"
    if s.final_eval_loss is not None:
        loss += f"; eval loss: best {_loss(s.best_eval_loss)}, final {_loss(s.final_eval_loss)}"
    lines.append(loss)
    if s.last_checkpoint is not None:
        disk = f"on disk: step(s) {step_ranges(s.checkpoint_steps)}" if s.checkpoint_steps else "none left on disk"
        gone = f"; rotated away: {step_ranges(s.rotated_steps)}" if s.rotated_steps else ""
        missing = "" if s.last_checkpoint.on_disk else " (no longer on disk)"
        lines.append(f"  last checkpoint: step {s.last_checkpoint.step}, {s.last_checkpoint.path}{missing} "
                     f"({disk}{gone})")
    else:
        lines.append("  last checkpoint: none under the run directory")
    lines += [f"  note: {n}" for n in s.notes]
    return lines
