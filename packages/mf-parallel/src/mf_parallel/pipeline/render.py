"""Pictures of a simulated schedule: a text timeline (one row per rank) and a PNG.

Text: each time unit is `width` characters; an action fills its duration with its label (`F3` the
forward of micro-batch 3, `B3` its backward or input gradient, `W3` its weight gradient; a chunk
index follows a dot, `F3.1`; `F3+B1` a combined action), `.` is idle time. The PNG needs
matplotlib (mf-parallel's `plot` extra).
"""

from __future__ import annotations

import math

from mf_parallel.errors import ParallelConfigError
from mf_parallel.pipeline.actions import Combined
from mf_parallel.pipeline.simulate import Simulation

_COLOURS = {"F": "#4c78a8", "B": "#54a24b", "W": "#f58518", "FB": "#b279a2"}


def _label(action) -> str:
    return action.label()


# Beyond this the text would be megabytes no terminal shows (10^4 stages: 300 MB): refused.
MAX_TEXT_CHARS = 2_000_000


def text_timeline(sim: Simulation, width: int | None = None, max_columns: int = 400,
                  max_chars: int = MAX_TEXT_CHARS) -> str:
    """One row per rank; `width` characters per unit of time (default: fits the longest label).
    ParallelConfigError when `width` is not positive or the text would exceed `max_chars`."""
    if width is not None and (isinstance(width, bool) or not isinstance(width, int) or width < 1):
        raise ParallelConfigError(f"--width: must be a positive integer, got {width!r}")
    unit = min(sim.costs.F, sim.costs.B, sim.costs.W)
    if width is None:
        longest = max((len(_label(a)) + 1 for line in sim.ranks for _, _, a in line.intervals), default=2)
        width = max(2, longest)
        width = max(1, min(width, max_columns // max(1, math.ceil(sim.makespan / unit))))
    columns = max(1, round(sim.makespan / unit * width))
    if columns * len(sim.ranks) > max_chars:
        raise ParallelConfigError(f"the text timeline would be {len(sim.ranks)} rows x {columns:,} columns, more than "
                                  f"{max_chars:,} characters ({width} per time unit)")
    rows = []
    for line in sim.ranks:
        cells = ["."] * columns
        for start, end, action in line.intervals:
            a, b = round(start / unit * width), round(end / unit * width)
            text = _label(action)[: max(0, b - a - 1)].ljust(b - a - 1, "-") + "|" if b - a > 1 else "|"
            cells[a:b] = list(text[: b - a])
        rows.append(f"rank {line.rank} " + "".join(cells))
    return "\n".join(rows)


def save_png(sim: Simulation, path: str, title: str | None = None) -> None:
    """The timeline as a Gantt chart (matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ParallelConfigError("--png needs matplotlib: pip install 'mf-parallel[plot]'") from None
    pp = len(sim.ranks)
    fig, ax = plt.subplots(figsize=(max(6.0, min(30.0, sim.makespan * 0.35)), 0.6 * pp + 1.2))
    for line in sim.ranks:
        y = pp - 1 - line.rank
        for start, end, action in line.intervals:
            kind = "FB" if isinstance(action, Combined) else action.op
            chunk = action.forward.chunk if isinstance(action, Combined) else action.chunk
            ax.broken_barh([(float(start), float(end - start))], (y + 0.1, 0.8), facecolors=_COLOURS[kind],
                           edgecolors="white", alpha=1.0 if chunk == 0 else 0.6)
            if end - start >= 0.6 * min(sim.costs.F, sim.costs.B, sim.costs.W):
                ax.text(float(start + end) / 2, y + 0.5, _label(action), ha="center", va="center", fontsize=6,
                        color="white")
    from matplotlib.patches import Patch

    names = {"F": "forward", "B": "input grad (dx)" if sim.schedule.split_backward else "backward",
             "W": "weight grad (dw)", "FB": "forward + backward"}
    used = {"FB" if isinstance(a, Combined) else a.op for line in sim.ranks for _, _, a in line.intervals}
    ax.legend(handles=[Patch(color=_COLOURS[k], label=names[k]) for k in ("F", "B", "W", "FB") if k in used],
              loc="upper right", fontsize=7, ncol=4)
    ax.set_yticks([pp - 1 - r + 0.5 for r in range(pp)], [f"rank {r}" for r in range(pp)])
    ax.set_ylim(0, pp + 0.6)
    ax.set_xlim(0, float(sim.makespan))
    ax.set_xlabel("time (units of the costs)")
    ax.set_title(title or sim.schedule.describe(), fontsize=9)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=150)
    except OSError as exc:
        raise ParallelConfigError(f"--png: cannot write {path} ({exc.strerror or exc})") from None
    finally:
        plt.close(fig)
