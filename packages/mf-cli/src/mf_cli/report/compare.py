"""Per-step comparison of two runs: the loss-compare check of the parity tests, for any two run directories.

For every step both runs recorded, the relative difference of a metric is
`|other - reference| / max(|reference|, 1e-12)` (the parity tests' formula, so `--rtol 1e-5` is
their tolerance); two NaNs, or two equal infinities, are no difference (both runs skipped that
step alike), a non-finite value against a finite one is an infinite difference. The largest one
and its step are kept per metric. Steps recorded by only one run are listed: they fail the check
unless the caller compares the common steps only (a run still going against a finished one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mf_cli.report.history import RunHistory, number, step_ranges

COMPARED = ("loss", "grad_norm")
_FLOOR = 1e-12


def relative_difference(reference: float, other: float) -> float:
    if math.isnan(reference) and math.isnan(other):
        return 0.0
    if not (math.isfinite(reference) and math.isfinite(other)):
        return 0.0 if reference == other else math.inf
    return abs(other - reference) / max(abs(reference), _FLOOR)


@dataclass
class MetricDifference:
    key: str
    max_relative: float = 0.0
    step: int | None = None              # where the largest difference is (the first such step)
    reference_value: float | None = None
    other_value: float | None = None
    over_rtol: list[int] = field(default_factory=list)  # every step above rtol


@dataclass
class Comparison:
    reference: str
    other: str
    rtol: float
    common_steps: list[int]
    only_in_reference: list[int]
    only_in_other: list[int]
    metrics: dict[str, MetricDifference]

    @property
    def within_rtol(self) -> bool:
        return bool(self.common_steps) and all(not m.over_rtol for m in self.metrics.values())

    def passed(self, common_only: bool = False) -> bool:
        return self.within_rtol and (common_only or not (self.only_in_reference or self.only_in_other))

    def failure(self, common_only: bool = False) -> str | None:
        """One line saying why the check fails, None when it passes."""
        if not self.common_steps:
            return f"{self.other} and {self.reference} have no training step in common"
        worst = max(self.metrics.values(), key=lambda m: m.max_relative)
        if worst.over_rtol:
            return (f"{self.other} differs from {self.reference}: {worst.key} relative difference "
                    f"{worst.max_relative:.3g} at step {worst.step} > rtol {self.rtol:g}")
        if not common_only and (self.only_in_reference or self.only_in_other):
            return (f"{self.other} and {self.reference} recorded different steps (add --common-only to compare "
                    "the steps both have)")
        return None


def compare_runs(reference: RunHistory, other: RunHistory, rtol: float, keys: tuple[str, ...] = COMPARED) -> Comparison:
    ref_steps, other_steps = set(reference.train), set(other.train)
    common = sorted(ref_steps & other_steps)
    metrics = {}
    for key in keys:
        diff = MetricDifference(key)
        for step in common:
            a, b = number(reference.train[step].get(key)), number(other.train[step].get(key))
            rel = relative_difference(a, b)
            if rel > rtol:
                diff.over_rtol.append(step)
            if diff.step is None or rel > diff.max_relative:
                diff.max_relative, diff.step, diff.reference_value, diff.other_value = rel, step, a, b
        metrics[key] = diff
    return Comparison(reference=reference.name, other=other.name, rtol=rtol, common_steps=common,
                      only_in_reference=sorted(ref_steps - other_steps), only_in_other=sorted(other_steps - ref_steps),
                      metrics=metrics)


def comparison_lines(c: Comparison, common_only: bool = False) -> list[str]:
    lines = [f"compare {c.other} against {c.reference} (rtol {c.rtol:g}): {len(c.common_steps)} common step(s)"]
    for m in c.metrics.values():
        if m.step is None:
            continue
        where = (f"at step {m.step} ({m.reference_value:.8g} vs {m.other_value:.8g})" if m.max_relative
                 else "(identical at every common step)")
        verdict = f"; above rtol at {len(m.over_rtol)} step(s): {step_ranges(m.over_rtol)}" if m.over_rtol else ""
        lines.append(f"  {m.key:<9} max relative difference {m.max_relative:.3g} {where}{verdict}")
    for steps, run in ((c.only_in_reference, c.reference), (c.only_in_other, c.other)):
        if steps:
            lines.append(f"  step(s) only in {run}: {step_ranges(steps)}"
                         + (" (not compared: --common-only)" if common_only else ""))
    lines.append(f"  {'OK' if c.passed(common_only) else 'FAIL: ' + c.failure(common_only)}")
    return lines
