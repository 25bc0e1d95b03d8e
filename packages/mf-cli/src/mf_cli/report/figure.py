"""The report figure: one PNG per run set, every run overlaid under its name.

Panels (each Axes is labelled with its key, so a caller or a test can find it):
    loss           training loss per step, evaluation loss as circles on a dashed line
    lr             learning rate
    grad_norm      gradient norm (before clipping)
    tokens_per_s   throughput
    mfu            model FLOPs utilisation, in percent
    compare        with comparisons only: relative difference of loss and grad norm per step
                   against the first run, on a symmetric log scale, with the rtol line
Skipped (non-finite) steps are red dotted verticals on every panel; checkpoints are triangles
along the top of the loss panel, in the run's colour (hollow: recorded, then rotated away). Every
line's gid names what it shows (`<run>`, `<run> eval`, `<run> checkpoints`, `<run> rotated
checkpoints`, `<run> skipped`, `<run> loss` / `<run> grad_norm` on the comparison panel).

matplotlib's object API on an Agg canvas: no pyplot, no GUI backend, no global state.
"""

from __future__ import annotations

import io
import math
import os

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from mf_cli.report.compare import Comparison, relative_difference
from mf_cli.report.history import RunHistory, number

PANELS = (  # (metric key in metrics.jsonl = the Axes label, title)
    ("loss", "loss"),
    ("lr", "learning rate"),
    ("grad_norm", "gradient norm"),
    ("tokens_per_s", "tokens/s"),
    ("mfu", "MFU (%)"),
)
_NO_DATA = {
    "mfu": "no MFU in the metrics (peak FLOP/s unknown: set monitor.peak_flops_per_device)",
}
WIDTH_IN, ROW_IN, DPI = 12.0, 3.3, 100


def _marker(n: int) -> str | None:
    return "." if n <= 60 else None   # points stay visible on a short run, lines on a long one


def _width(i: int, n: int) -> float:
    # Earlier runs drawn wider, so a run that matches another exactly still shows beneath it.
    return 1.2 + 2.0 * (n - 1 - i) / max(1, n - 1)


def build_figure(runs: list[RunHistory], comparisons: list[Comparison] | None = None) -> Figure:
    rows = 4 if comparisons else 3
    fig = Figure(figsize=(WIDTH_IN, ROW_IN * rows), dpi=DPI, layout="constrained")
    grid = fig.add_gridspec(rows, 2)
    axes = {"loss": fig.add_subplot(grid[0, :])}
    for (key, _), cell in zip(PANELS[1:], [grid[1, 0], grid[1, 1], grid[2, 0], grid[2, 1]]):
        axes[key] = fig.add_subplot(cell, sharex=axes["loss"])
    colors = [f"C{i % 10}" for i in range(len(runs))]
    for key, title in PANELS:
        ax = axes[key]
        ax.set_label(key)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        plotted = False
        for i, (run, color) in enumerate(zip(runs, colors)):
            steps, values = run.series(key)
            if key == "mfu":
                values = [100.0 * v for v in values]
            if any(math.isfinite(v) for v in values):
                ax.plot(steps, values, color=color, marker=_marker(len(steps)), markersize=4,
                        linewidth=_width(i, len(runs)), label=run.name if key == "loss" else None, gid=run.name)
                plotted = True
        if key == "loss":
            plotted |= _evaluations(ax, runs, colors)
            _checkpoints(ax, runs, colors)
        _skipped(ax, runs)
        if not plotted:
            ax.text(0.5, 0.5, _NO_DATA.get(key, f"no {key} in the metrics"), transform=ax.transAxes,
                    ha="center", va="center", color="0.4")
    if comparisons:
        _comparison_panel(fig.add_subplot(grid[3, :], sharex=axes["loss"]), runs, comparisons, colors)
    axes["lr"].ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    _legend(axes["loss"], runs)
    fig.suptitle("mf report: " + ", ".join(run.name for run in runs))
    return fig


def _evaluations(ax, runs, colors) -> bool:
    plotted = False
    for i, (run, color) in enumerate(zip(runs, colors)):
        steps, values = run.series("eval_loss", evals=True)
        if any(math.isfinite(v) for v in values):
            ax.plot(steps, values, color=color, linestyle="--", linewidth=_width(i, len(runs)), marker="o",
                    markersize=5, markerfacecolor="white", label=f"{run.name} eval", gid=f"{run.name} eval")
            plotted = True
    return plotted


def _checkpoints(ax, runs, colors) -> None:
    # Near the top edge (x in data, y in axes coordinates), clear of the curves' scale.
    # One row per run, stepped down, so runs that saved at the same steps stay distinguishable.
    for i, (run, color) in enumerate(zip(runs, colors)):
        for on_disk, gid, face in ((True, f"{run.name} checkpoints", color),
                                   (False, f"{run.name} rotated checkpoints", "white")):
            steps = sorted({c.step for c in run.checkpoints if c.on_disk == on_disk})
            if steps:
                ax.plot(steps, [0.95 - 0.05 * i] * len(steps), transform=ax.get_xaxis_transform(), linestyle="none",
                        marker="v", markersize=7, color=color, markerfacecolor=face, gid=gid)


def _skipped(ax, runs) -> None:
    for run in runs:
        for step in run.skipped_steps:
            ax.axvline(step, color="red", linestyle=":", linewidth=1.0, alpha=0.7, gid=f"{run.name} skipped")


def _legend(ax, runs) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if any(run.checkpoints for run in runs):
        handles.append(Line2D([], [], linestyle="none", marker="v", color="0.3", markersize=8))
        labels.append("checkpoint")
    if any(run.skipped_steps for run in runs):
        handles.append(Line2D([], [], color="red", linestyle=":"))
        labels.append("skipped step")
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")


def _comparison_panel(ax, runs, comparisons: list[Comparison], colors) -> None:
    ax.set_label("compare")
    ax.set_title(f"relative difference against {comparisons[0].reference}")
    ax.set_xlabel("step")
    ax.grid(True, alpha=0.3)
    reference = runs[0]
    by_name = {run.name: (run, color) for run, color in zip(runs, colors)}
    rtol = comparisons[0].rtol
    # symlog: exact agreement (0) stays on the plot, below rtol the scale is linear.
    ax.set_yscale("symlog", linthresh=max(rtol, 1e-12) / 10)
    for comparison in comparisons:
        run, color = by_name[comparison.other]
        for key, style in (("loss", "-"), ("grad_norm", "--")):
            steps = comparison.common_steps
            diffs = [relative_difference(number(reference.train[s].get(key)), number(run.train[s].get(key)))
                     for s in steps]
            ax.plot(steps, [d if math.isfinite(d) else math.nan for d in diffs], color=color, linestyle=style,
                    marker=_marker(len(steps)), markersize=4, label=f"{run.name} {key}", gid=f"{run.name} {key}")
    ax.axhline(rtol, color="0.2", linestyle=":", linewidth=1.0, label=f"rtol {rtol:g}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")


def save_figure(fig: Figure, path: str | os.PathLike) -> tuple[int, int]:
    """Write the PNG atomically (a temporary file beside it, then a rename); returns (width, height) in pixels."""
    from mf_cli.files import write_atomically

    png = io.BytesIO()
    FigureCanvasAgg(fig).print_png(png)
    write_atomically(path, png.getvalue())     # mode 0666 less the umask, like any file the user makes
    width, height = fig.canvas.get_width_height()
    return width, height
