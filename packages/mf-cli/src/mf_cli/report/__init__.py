"""`mf report`'s parts, usable on their own (none of them imports MindSpore):

    from mf_cli.report import read_run, summarize, compare_runs, build_figure, save_figure

    runs = [read_run("output/a"), read_run("output/b", name="tp2")]
    print(compare_runs(runs[0], runs[1], rtol=1e-5).failure())
    save_figure(build_figure(runs), "report.png")

`history` reads a run directory (standard library only), `summary` and `compare` compute, `figure`
draws with matplotlib (imported on first use of build_figure / save_figure).
"""

from __future__ import annotations

from mf_cli.report.compare import Comparison, MetricDifference, compare_runs, comparison_lines, relative_difference
from mf_cli.report.history import Checkpoint, RunHistory, RunReadError, read_run, step_ranges
from mf_cli.report.summary import RunSummary, summarize, summary_lines

__all__ = [
    "Checkpoint", "Comparison", "MetricDifference", "RunHistory", "RunReadError", "RunSummary", "build_figure",
    "compare_runs", "comparison_lines", "read_run", "relative_difference", "save_figure", "step_ranges",
    "summarize", "summary_lines",
]


def __getattr__(name: str):
    # The figure module imports matplotlib: load it only for callers that draw.
    if name in ("build_figure", "save_figure"):
        from mf_cli.report import figure

        return getattr(figure, name)
    raise AttributeError(f"module 'mf_cli.report' has no attribute {name!r}")
