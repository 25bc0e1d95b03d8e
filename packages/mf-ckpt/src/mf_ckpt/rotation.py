"""`save_max`: keep the newest N committed checkpoints.

Age is the commit time recorded in common.json (directory mtime if unreadable), so a resumed run
that saves lower iteration numbers than leftovers of an abandoned run still keeps its own newest
ones. The marker's checkpoint is never deleted, and directories being written are not candidates
(their names are hidden `.iteration_*.incomplete`). Deletion renames to a hidden trash name first,
so a crash mid-delete never leaves a half-deleted `iteration_*` directory behind.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path

from .ckpt_dir import COMMON, MARKER, committed_dirs, read_marker, trash_name


def _saved_at(path: Path) -> float:
    try:
        return float(json.loads((path / COMMON).read_text())["saved_at"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError):  # damaged: its mtime will do
        try:
            return path.stat().st_mtime
        except OSError:
            return 0.0


def rotate(root: Path, save_max: int | None, keep: int) -> list[int]:
    """Delete committed checkpoints beyond the newest `save_max`; returns deleted iterations."""
    if save_max is None:
        return []
    dirs = committed_dirs(root)
    order = sorted(dirs, key=lambda it: (_saved_at(dirs[it]), it))
    protected = set(order[-save_max:]) | {keep}
    marker = read_marker(root)
    if marker is not None:
        protected.add(marker)
    deleted = []
    for it in order:
        if it in protected:
            continue
        trash = Path(root) / trash_name(dirs[it].name, secrets.token_hex(4))
        os.replace(dirs[it], trash)
        shutil.rmtree(trash, ignore_errors=True)
        deleted.append(it)
    return deleted


def remove_leftovers(root: Path) -> None:
    """Delete what interrupted saves leave behind: hidden staging/trash/replaced directories and
    temp files of the marker. Called by rank 0 right after a commit, when no save is in flight."""
    for p in Path(root).iterdir():
        if p.name.startswith(".iteration_") and p.name.endswith((".incomplete", ".trash", ".replaced")):
            shutil.rmtree(p, ignore_errors=True)
        elif p.name.startswith(f".{MARKER}.") and p.name.endswith(".tmp"):
            p.unlink(missing_ok=True)
