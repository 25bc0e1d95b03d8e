"""A run directory read back: RUN_DIR -> the training and evaluation records per step, its
sessions and its checkpoints.

mf-trainer's MetricsLogger appends one JSON object per line to `<output_dir>/metrics.jsonl`, each
with `step` (and, from mf-trainer 0.5, `time`: wall clock, Unix seconds): a training step when the
record has `loss`, an evaluation when it has `eval_loss`, a committed checkpoint when it has
`checkpoint` (its path), the start of a session (a new run or a resume) when it has `start` (non-
finite floats are written as the strings "nan", "inf", "-inf"). Checkpoints come from those
records (each marked whether it is still on disk: `save_max` rotates old ones away); a file
without them (mf-trainer < 0.5) falls back to the committed `iteration_*` directories of a save
directory under RUN_DIR (the default `<output_dir>/checkpoint`, or any direct subdirectory holding
a `latest_checkpointed_iteration.txt`), where the rotated ones are not seen.

What the file may look like, and what is made of it:
- a run still going: its last line may be half-written (no newline yet); it is left out and noted.
- a run resumed, or rerun, into the same directory: when a training record's step is not above
  every step already read, the file's history restarts there, as the Trainer's own resume does
  (it cuts the lines after the checkpoint it resumes from): the earlier records of that step and
  later ones are replaced by what follows, and the duplicates are noted, never silently merged.
- anything else unreadable (a line in the middle that is not a JSON object with an integer
  `step`, bytes that are not UTF-8) is an error naming the file and line.

Standard library only: reading a run needs neither MindSpore nor matplotlib.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

METRICS_FILE = "metrics.jsonl"
CHECKPOINT_MARKER = "latest_checkpointed_iteration.txt"  # mf-ckpt's commit point of a save directory
_ITERATION_DIR = re.compile(r"^iteration_(\d{8,})$")
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "infinity": math.inf, "-infinity": -math.inf}


class RunReadError(ValueError):
    """A RUN_DIR that cannot be reported on: missing, no metrics, an unreadable line."""


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: Path
    latest: bool  # the last one committed (the one latest_checkpointed_iteration.txt names)
    on_disk: bool = True  # False: recorded, then rotated away (save_max) or removed


@dataclass
class Session:
    """One process's part of the run: from `started` (its start record) to its last record."""

    start_step: int
    started: float
    last_time: float


@dataclass
class RunHistory:
    """One run's records, the latest of each step, in step order."""

    name: str
    path: Path                                   # the run directory
    metrics_path: Path
    train: dict[int, dict] = field(default_factory=dict)   # step -> training record
    evals: dict[int, dict] = field(default_factory=dict)   # step -> evaluation record
    checkpoints: list[Checkpoint] = field(default_factory=list)
    sessions: list[Session] = field(default_factory=list)
    duplicate_steps: list[int] = field(default_factory=list)   # steps whose training record was written again
    superseded_steps: list[int] = field(default_factory=list)  # steps of an earlier attempt never written again
    restarts: list[tuple[int, int]] = field(default_factory=list)  # (last step before, step the file restarted at)
    torn_last_line: bool = False
    unknown_records: int = 0                     # records that are neither a training step nor an evaluation
    notes: list[str] = field(default_factory=list)  # checkpoint directories that could not be read

    @property
    def steps(self) -> list[int]:
        return list(self.train)

    @property
    def skipped_steps(self) -> list[int]:
        return [s for s, r in self.train.items() if r.get("skipped") is True]

    @property
    def last_checkpoint(self) -> Checkpoint | None:
        latest = [c for c in self.checkpoints if c.latest]
        return max(latest or self.checkpoints, key=lambda c: c.step, default=None)

    @property
    def wall_time(self) -> float | None:
        """Seconds the run's sessions took, added up (the time between a kill and the rerun is not
        in it); None when the file records no sessions (mf-trainer < 0.5)."""
        spans = [s.last_time - s.started for s in self.sessions if math.isfinite(s.last_time - s.started)]
        return math.fsum(spans) if spans else None

    def series(self, key: str, *, evals: bool = False) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric; a record without a number for it gives NaN there."""
        records = self.evals if evals else self.train
        return list(records), [number(r.get(key)) for r in records.values()]


def number(value) -> float:
    """A metric value as a float: NaN when absent or not a number (bools are not numbers here)."""
    if isinstance(value, bool) or value is None:
        return math.nan
    if isinstance(value, (int, float)):
        return float(value)
    return math.nan


def _decode(value):
    # MetricsLogger writes non-finite floats as strings (strict JSON has no NaN/Infinity).
    if isinstance(value, str) and value.lower() in _NON_FINITE:
        return _NON_FINITE[value.lower()]
    return value


def _parse_lines(path: Path) -> tuple[list[dict], bool]:
    """Every record of the file, and whether an unterminated last line was left out."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise RunReadError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RunReadError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    lines = text.split("\n")
    # A writer appends `json + "\n"`: a last piece without its newline is a line being written.
    unterminated = lines.pop() if lines else ""
    records, torn = [], False
    for number_, line in enumerate([*lines, unterminated], start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as exc:
            if number_ == len(lines) + 1:
                torn = True
                continue
            why = "nested too deeply" if isinstance(exc, RecursionError) else getattr(exc, "msg", exc)
            raise RunReadError(f"{path}:{number_}: not a JSON object ({why})") from None
        step = record.get("step") if isinstance(record, dict) else None
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise RunReadError(f"{path}:{number_}: a metrics record needs a non-negative integer 'step', got "
                               f"{line.strip()[:60]!r}")
        records.append({k: _decode(v) for k, v in record.items()})
    return records, torn


def _metrics_path(run_dir: Path) -> tuple[Path, Path]:
    """(run directory, metrics file) for a RUN_DIR or a path to its metrics.jsonl."""
    if run_dir.is_file():
        return run_dir.parent, run_dir
    if not run_dir.exists():
        raise RunReadError(f"{run_dir}: no such directory")
    if not run_dir.is_dir():
        raise RunReadError(f"{run_dir}: not a run directory")
    path = run_dir / METRICS_FILE
    if not path.is_file():
        raise RunReadError(f"{run_dir}: no {METRICS_FILE} (not an mf run directory, or its first step has not "
                           "finished yet)")
    return run_dir, path


def read_run(run_dir: str | os.PathLike, name: str | None = None) -> RunHistory:
    """Read RUN_DIR (an mf-trainer `output_dir`, or its metrics.jsonl itself)."""
    directory, path = _metrics_path(Path(run_dir))
    records, torn = _parse_lines(path)
    run = RunHistory(name=name or directory.resolve().name, path=directory, metrics_path=path, torn_last_line=torn)
    written: dict[int, int] = {}   # step -> training records of it read so far
    recorded: dict[int, Path] = {}  # step -> checkpoint path, from the checkpoint records
    # run.train stays in ascending step order (a record either extends it or cuts it first), so the
    # last step is its last key and a restart pops from its end; evaluation steps are kept sorted
    # beside their dict: each record costs O(1) amortised, not O(steps) (100k lines: seconds, not minutes).
    eval_steps: list[int] = []
    for record in records:
        step = record["step"]
        moment = number(record.get("time"))
        if "start" in record:
            run.sessions.append(Session(step, number(record["start"]), moment))
            continue
        if run.sessions and math.isfinite(moment):
            run.sessions[-1].last_time = max(run.sessions[-1].last_time, moment)
        if "checkpoint" in record and isinstance(record["checkpoint"], str):
            recorded.pop(step, None)
            recorded[step] = Path(record["checkpoint"])
            continue
        if "loss" in record:
            last = next(reversed(run.train)) if run.train else None
            if last is not None and step <= last:
                run.restarts.append((last, step))
                while run.train and next(reversed(run.train)) >= step:
                    run.train.popitem()
                cut = bisect.bisect_left(eval_steps, step)
                for stale in eval_steps[cut:]:
                    del run.evals[stale]
                del eval_steps[cut:]
            run.train[step] = record
            written[step] = written.get(step, 0) + 1
        elif "eval_loss" in record:
            if step not in run.evals:
                bisect.insort(eval_steps, step)
            run.evals[step] = record  # a later evaluation of the same step replaces it
        else:
            run.unknown_records += 1
    if not run.train and not run.evals:
        raise RunReadError(f"{path}: holds no training or evaluation records")
    run.duplicate_steps = sorted(s for s, n in written.items() if n > 1)
    run.superseded_steps = sorted(s for s in written if s not in run.train)
    run.train = dict(sorted(run.train.items()))
    run.evals = dict(sorted(run.evals.items()))
    if recorded:
        last = max(recorded)
        run.checkpoints = [Checkpoint(step, path, step == last, path.is_dir()) for step, path in sorted(recorded.items())]
    else:
        run.checkpoints = _checkpoints(directory, run.notes)
    return run


def _save_directories(run_dir: Path) -> list[Path]:
    """RUN_DIR itself and its direct subdirectories that hold a checkpoint commit marker."""
    candidates = [run_dir]
    try:
        candidates += sorted(p for p in run_dir.iterdir() if p.is_dir())
    except OSError:
        pass
    return [d for d in candidates if (d / CHECKPOINT_MARKER).is_file()]


def _checkpoints(run_dir: Path, notes: list[str]) -> list[Checkpoint]:
    found: list[Checkpoint] = []
    for save_dir in _save_directories(run_dir):
        marker = save_dir / CHECKPOINT_MARKER
        try:
            text = marker.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            notes.append(f"{marker}: cannot read ({exc}); its checkpoints are not shown")
            continue
        if not text.isdigit():
            notes.append(f"{marker}: expected an iteration number, found {text[:40]!r}; its checkpoints are not shown")
            continue
        committed = int(text)
        for child in sorted(save_dir.iterdir()):
            match = _ITERATION_DIR.match(child.name)
            # A directory above the marker's iteration was renamed into place but never committed.
            if match and child.is_dir() and int(match.group(1)) <= committed:
                step = int(match.group(1))
                found.append(Checkpoint(step=step, path=child, latest=step == committed))
    return sorted(found, key=lambda c: (c.step, str(c.path)))


def step_ranges(steps: list[int]) -> str:
    """`1-3, 7, 9-12` for [1, 2, 3, 7, 9, 10, 11, 12]."""
    ordered = sorted(set(steps))
    # Consecutive steps share `step - position`: each group is one run of steps.
    runs = [[s for _, s in group] for _, group in itertools.groupby(enumerate(ordered), lambda p: p[1] - p[0])]
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
