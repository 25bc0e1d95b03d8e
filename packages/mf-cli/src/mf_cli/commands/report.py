"""`mf report RUN_DIR [RUN_DIR ...] [--name N ...] [--out PATH | --no-plot] [--compare [--rtol X] [--common-only]]`.

Reads each run directory (an mf train `output_dir`: its metrics.jsonl and the checkpoints under
it; mf_cli.report.history says exactly how), prints a summary per run, optionally compares every
run with the first one step by step, and draws one PNG of them all: by default `report.png` in
the run directory (several runs: in the directory holding them, e.g. `output/report.png` for
`mf report output/*`, or the first run's when that one cannot be written). Works on a run still
going and on runs resumed several times. Imports neither MindSpore nor any mf package beyond mf_cli.

Several RUN_DIRs: one that cannot be read (missing, no metrics yet, a damaged line) is skipped
with one `mf report: skipped RUN_DIR: why` line on stderr and the others are reported; with
--compare the first (the reference) must be readable. A .png among them (an earlier report, as
`output/*` finds `output/report.png`) is left out with a note.

--out must name a .png file, and an existing file there must be a PNG: a run's metrics.jsonl,
config.yaml or checkpoint files are never replaced by a picture.

Exit status: 0 done (and, with --compare, every run within --rtol of the first on every common
step, and the same steps recorded unless --common-only); 1 a comparison failed; 2 bad input (no
RUN_DIR readable, the --compare reference unreadable, bad arguments, an --out that cannot be
written), one line on stderr, nothing written.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

from mf_cli.errors import UsageError

DEFAULT_OUT = "report.png"
DEFAULT_RTOL = 1e-5   # the parity tests' tolerance (fp32, per-step loss and grad norm)


def add_parser(subparsers, name: str, help_text: str) -> None:
    parser = subparsers.add_parser(name, help=help_text, description=help_text)
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="a training output_dir (or its metrics.jsonl); several are overlaid")
    parser.add_argument("--name", dest="names", action="append", default=[], metavar="NAME",
                        help="the name of each RUN_DIR in the legend and the text, in order (once per RUN_DIR; "
                             "default: the directory's name)")
    parser.add_argument("--out", metavar="PATH",
                        help=f"where to write the PNG, a .png file (default: {DEFAULT_OUT} in the run directory; several "
                             "runs: in the directory holding them)")
    parser.add_argument("--no-plot", action="store_true", help="print the summaries (and comparison) only")
    parser.add_argument("--compare", action="store_true",
                        help="compare loss and grad norm of every run with the first one, step by step; "
                             "exit 1 when a relative difference exceeds --rtol")
    parser.add_argument("--rtol", type=float, metavar="X",
                        help=f"relative tolerance of --compare (default {DEFAULT_RTOL:g}, the parity tests')")
    parser.add_argument("--common-only", action="store_true",
                        help="with --compare: steps recorded by only one run are listed but do not fail the check")
    parser.set_defaults(run=run)


def _check_args(args) -> None:
    if args.rtol is not None and not args.compare:
        raise UsageError("--rtol applies to --compare; add --compare")
    if args.common_only and not args.compare:
        raise UsageError("--common-only applies to --compare; add --compare")
    if args.rtol is not None and not (math.isfinite(args.rtol) and args.rtol >= 0):
        raise UsageError(f"--rtol: must be a finite number >= 0, got {args.rtol}")
    if args.compare and len(args.run_dirs) < 2:
        raise UsageError("--compare needs at least two RUN_DIRs (the first is the reference)")
    if args.names and len(args.names) != len(args.run_dirs):
        raise UsageError(f"--name: given {len(args.names)} time(s) for {len(args.run_dirs)} RUN_DIR(s); "
                         "give one per RUN_DIR, in order")
    if len(set(args.names)) != len(args.names):
        raise UsageError("--name: every run needs a different name")
    resolved = [os.path.realpath(p) for p in args.run_dirs]
    for i, path in enumerate(resolved):
        if path in resolved[:i]:
            raise UsageError(f"{args.run_dirs[i]}: given twice")
    if args.no_plot and args.out:
        raise UsageError("--out and --no-plot: choose one")
    if args.out is not None:
        _check_out(Path(args.out))


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _check_out(out: Path) -> None:
    """--out (or the default) can take the PNG: a .png name, not a directory, a writable parent,
    and nothing but a PNG replaced (a run's metrics.jsonl or checkpoint files stay theirs)."""
    if out.is_dir():
        raise UsageError(f"--out {out}: is a directory; give a file name")
    if out.suffix.lower() != ".png":
        raise UsageError(f"--out {out}: not a .png file name (the report is drawn as a PNG)")
    if out.exists() or out.is_symlink():
        try:
            with open(out, "rb") as f:
                head = f.read(len(PNG_MAGIC))
        except OSError as exc:
            raise UsageError(f"--out {out}: exists and cannot be read ({exc.strerror or exc})") from None
        if head != PNG_MAGIC:
            raise UsageError(f"--out {out}: exists and is not a PNG; refusing to replace it (choose another name)")
    if not out.resolve().parent.is_dir():
        raise UsageError(f"--out {out}: the directory {out.resolve().parent} does not exist")
    if not os.access(out.resolve().parent, os.W_OK):
        raise UsageError(f"--out {out}: the directory {out.resolve().parent} is not writable")


def _default_out(runs) -> Path:
    """report.png in the run directory; for several runs in the directory holding them all (the
    first run's when that is the filesystem root or cannot be written)."""
    directories = [Path(os.path.realpath(r.path)) for r in runs]
    place = directories[0]
    if len(directories) > 1:
        common = Path(os.path.commonpath([str(d) for d in directories]))
        if common != Path(common.anchor) and os.access(common, os.W_OK):
            place = common
    shown = os.path.relpath(place / DEFAULT_OUT)       # as the user named the runs, when below here
    return Path(shown) if not shown.startswith("..") else place / DEFAULT_OUT


def _default_names(paths: list[str]) -> list[str]:
    """Directory names; where two runs share one, their paths below the common parent."""
    real = [Path(os.path.realpath(p)) for p in paths]
    real = [p.parent if p.is_file() else p for p in real]   # a metrics.jsonl path names its run directory
    names = [p.name for p in real]
    if len(set(names)) == len(names):
        return names
    common = Path(os.path.commonpath([str(p) for p in real]))
    return [str(p.relative_to(common)) if p != common else p.name for p in real]


def run(args) -> int:
    # `mf report output/*` a second time meets the first one's output/report.png: a picture is not a run
    pictures = [p for p in args.run_dirs if p.lower().endswith(".png") and os.path.isfile(p)]
    if pictures and len(pictures) < len(args.run_dirs):
        args.run_dirs = [p for p in args.run_dirs if p not in pictures]
        print(f"mf report: note: left out {', '.join(pictures)} (a PNG, not a run directory)", file=sys.stderr)
    _check_args(args)
    from mf_cli.report import RunReadError, compare_runs, comparison_lines, read_run, summarize, summary_lines

    names = args.names or _default_names(args.run_dirs)
    runs, skipped = [], []
    for i, (path, name) in enumerate(zip(args.run_dirs, names)):
        try:
            runs.append(read_run(path, name=name))
        except RunReadError as exc:
            if len(args.run_dirs) == 1 or (args.compare and i == 0):   # nothing to report, or no reference
                raise UsageError(str(exc) + (" (the --compare reference)" if args.compare else "")) from None
            skipped.append(f"mf report: skipped {path}: {exc}")
    for line in skipped:
        print(line, file=sys.stderr)
    if not runs:
        raise UsageError(f"none of the {len(args.run_dirs)} RUN_DIRs could be read (each is listed above)")
    if args.compare and len(runs) < 2:
        raise UsageError("--compare: only the reference could be read; nothing to compare it with")
    out = None
    if not args.no_plot:
        out = Path(args.out) if args.out else _default_out(runs)
        _check_out(out)
    for run_ in runs:
        print("\n".join(summary_lines(summarize(run_))))
    comparisons = []
    if args.compare:
        rtol = DEFAULT_RTOL if args.rtol is None else args.rtol
        comparisons = [compare_runs(runs[0], other, rtol) for other in runs[1:]]
        for comparison in comparisons:
            print("\n".join(comparison_lines(comparison, args.common_only)))
    if out is not None:
        from mf_cli.report import build_figure, save_figure

        try:
            width, height = save_figure(build_figure(runs, comparisons), out)
        except OSError as exc:
            raise UsageError(f"--out {out}: cannot be written ({exc.strerror or exc})") from None
        print(f"mf report: wrote {out} ({width}x{height} px, {len(runs)} run(s))")
    failures = [c.failure(args.common_only) for c in comparisons if not c.passed(args.common_only)]
    for failure in failures:
        print(f"mf report: compare: {failure}", file=sys.stderr)
    return 1 if failures else 0
