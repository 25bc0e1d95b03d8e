"""`<output_dir>/summary.json`: what a run did, written when a session ends (finished, stopped by a
callback, failed or interrupted), computed over the run's whole history in metrics.jsonl (every
session of it, not only the last).

    {"status": "finished", "reason": null, "step": 300, "total_steps": 300, "start_step": 200,
     "sessions": 2, "wall_time_s": 171.2, "step_time_s": 160.4, "median_tokens_per_s": 14310.0,
     "median_mfu": 0.21, "best_loss": {"value": 4.52, "step": 287}, "final_loss": {"value": 4.6, "step": 300},
     "skipped_steps": 0, "consumed_samples": 4800, "last_checkpoint": {"step": 300, "path": "..."},
     "output_dir": "...", "written": "2026-12-01T17:30:53+00:00"}

Wall time is the sum over sessions of (last record's time - the session's start), so the time
between a kill and the rerun is not counted; `step_time_s` is the sum of the steps' own times.
Medians ignore non-finite values (MFU is null when the peak is unknown). Compact arrays: a
million-step run costs a few tens of MB, not a dict per step.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from array import array
from datetime import datetime, timezone
from pathlib import Path


def _number(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)


class RunHistory:
    """The numbers summary.json needs, fed one metrics record at a time."""

    def __init__(self) -> None:
        self.steps = array("q")
        self.losses = array("d")
        self.tokens_per_s = array("d")
        self.mfu = array("d")
        self.step_time = 0.0
        self.skipped = 0
        self.sessions: list[list[float]] = []     # [start time, last record time]
        self.last_checkpoint: dict | None = None

    def add(self, record: dict) -> None:
        t = _number(record.get("time"))
        if "start" in record:
            self.sessions.append([_number(record["start"]), _number(record["start"])])
        elif self.sessions and math.isfinite(t):
            self.sessions[-1][1] = max(self.sessions[-1][1], t)
        if "loss" in record:
            self.steps.append(int(record["step"]))
            self.losses.append(_number(record["loss"]))
            self.tokens_per_s.append(_number(record.get("tokens_per_s")))
            self.mfu.append(_number(record.get("mfu")))
            step_time = _number(record.get("step_time_s"))
            self.step_time += step_time if math.isfinite(step_time) else 0.0
            self.skipped += record.get("skipped") is True
        elif "checkpoint" in record:
            self.last_checkpoint = {"step": int(record["step"]), "path": str(record["checkpoint"])}

    @property
    def wall_time(self) -> float:
        spans = [end - start for start, end in self.sessions if math.isfinite(start) and math.isfinite(end)]
        return math.fsum(spans) if spans else self.step_time

    def best_loss(self) -> dict | None:
        finite = [(v, s) for s, v in zip(self.steps, self.losses) if math.isfinite(v)]
        if not finite:
            return None
        value, step = min(finite)
        return {"value": value, "step": step}

    def final_loss(self) -> dict | None:
        return {"value": self.losses[-1], "step": self.steps[-1]} if self.steps else None


def _median(values) -> float | None:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.median(finite) if finite else None


def _json_number(value):
    return value if value is None or math.isfinite(value) else str(value)


def build_summary(history: RunHistory, *, status: str, reason: str | None, step: int, total_steps: int,
                  start_step: int, consumed_samples: int, output_dir: str) -> dict:
    final = history.final_loss()
    return {
        "status": status, "reason": reason, "step": step, "total_steps": total_steps, "start_step": start_step,
        "sessions": len(history.sessions), "wall_time_s": round(history.wall_time, 3),
        "step_time_s": round(history.step_time, 3),
        "median_tokens_per_s": _median(history.tokens_per_s), "median_mfu": _median(history.mfu),
        "best_loss": history.best_loss(),
        "final_loss": None if final is None else {**final, "value": _json_number(final["value"])},
        "skipped_steps": history.skipped, "consumed_samples": consumed_samples,
        "last_checkpoint": history.last_checkpoint, "output_dir": output_dir,
        "written": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def write_summary(output_dir: str, summary: dict) -> Path:
    """Atomically (a temporary file beside it, then a rename)."""
    path = Path(output_dir) / "summary.json"
    tmp = path.with_name(f".summary.json.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(summary, indent=1) + "\n")
    os.replace(tmp, path)
    return path
