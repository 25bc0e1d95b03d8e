"""What msrun starts on every rank under `mf_parallel.launch`: run the real script, and report.

Usage (by the launcher): python _rank_entry.py SCRIPT [ARGS...]. The launcher watches the files
written here in $MF_LAUNCH_STATUS_DIR:
  rank_<r>.pid     written first: the worker's pid, so the launcher can notice it disappear
  rank_<r>.failed  the error, written when the script raises (its last traceback line first, then
                   the traceback) or exits with a non-zero code (`exited with code N: ` and the
                   error lines the script printed on stderr, e.g. `mf train: error: ...`)
  rank_<r>.done    written when the script returns normally
A rank that vanishes without writing .done or .failed was killed (signal, OOM killer).
msrun also starts the cluster's scheduler with this same command (MS_ROLE=MS_SCHED, RANK_ID=0);
it reports as `scheduler.*`, so it never overwrites rank 0's files, and a scheduler that fails
(e.g. its port was taken) ends the job at once instead of after the workers' cluster time-out.
This file imports nothing from mf_parallel: it must start fast and cannot fail on import.
"""

from __future__ import annotations

import os
import re
import runpy
import sys
import traceback
from pathlib import Path


def _reporter() -> str:
    """The status-file stem of this process: `scheduler` or `rank_<r>`."""
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        return "scheduler"
    for key in ("RANK_ID", "MS_NODE_ID", "RANK"):
        value = os.environ.get(key)
        if value is not None and value.isdigit():
            return f"rank_{value}"
    return f"rank_{os.getpid()}"


# What a CLI prints as its own one-line error before it exits non-zero (mf: "mf train: error: ...",
# "mf train: training failed: ..."; argparse: "prog: error: ...").
_ERROR_LINE = re.compile(r"^\S+( \S+)?: (error|training failed|evaluation failed|failed): ")


class _StderrTail:
    """Passes writes through to the real stderr and keeps the last lines, so the launcher can name
    the error a script printed before exiting non-zero."""

    def __init__(self, stream, keep: int = 50):
        self.stream, self.keep, self.lines, self.partial = stream, keep, [], ""

    def write(self, text):
        self.partial += text
        *done, self.partial = self.partial.split("\n")
        self.lines = (self.lines + done)[-self.keep:]
        return self.stream.write(text)

    def flush(self):
        return self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)

    def error(self) -> str:
        lines = [x for x in [*self.lines, self.partial] if x.strip()]
        own = [x for x in lines if _ERROR_LINE.match(x)]
        return "; ".join(own) if own else (lines[-1] if lines else "")


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)   # atomic: the launcher never reads half a message


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: _rank_entry.py SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    status_dir = os.environ.get("MF_LAUNCH_STATUS_DIR")
    status = Path(status_dir) if status_dir else None
    me = _reporter()
    if status is not None:
        _write(status / f"{me}.pid", str(os.getpid()))
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    # As `python SCRIPT` would: the script's directory first on sys.path, not this package's.
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    code = 0
    tail = _StderrTail(sys.stderr)
    sys.stderr = tail
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if status is not None:
            # sys.exit(0) is a normal end (a CLI's main returns its code through it).
            reason = tail.error() or (str(exc.code) if not isinstance(exc.code, int) else "no error printed")
            _write(status / f"{me}.{'failed' if code else 'done'}",
                   f"exited with code {code}: {reason}\n" if code else "ok\n")
    except BaseException as exc:  # noqa: BLE001 - every failure must be reported to the launcher
        code = 1
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        sys.stderr.flush()
        if status is not None:
            _write(status / f"{me}.failed", f"{type(exc).__name__}: {exc}\n\n{tb}")
    else:
        if status is not None:
            _write(status / f"{me}.done", "ok\n")
    finally:
        sys.stderr = tail.stream
    sys.stdout.flush()
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    rc = main()
    if rc:
        # A failed rank leaves at once: MindSpore's shutdown would wait for peers that are
        # blocked in a collective with it.
        os._exit(rc)
    sys.exit(0)
