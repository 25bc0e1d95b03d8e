"""Names inside a save directory, the commit marker, and finding the checkpoint to load.

    <save_path>/latest_checkpointed_iteration.txt    the iteration number; replaced atomically last
    <save_path>/iteration_00000100/                  a committed checkpoint
    <save_path>/.iteration_00000100.<token>.incomplete   being written (never loaded)
    <save_path>/.iteration_00000100.replaced         the previous copy while iteration 100 is re-saved
    <save_path>/.iteration_00000100.<token>.trash    being deleted (rotation, stale attempts)
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from .errors import CheckpointError
from .fsutil import atomic_write_bytes

MARKER = "latest_checkpointed_iteration.txt"
METADATA = "metadata.json"
COMMON = "common.json"
FORMAT = "mf-ckpt"
FORMAT_VERSION = 1

_ITER_RE = re.compile(r"^iteration_([0-9]{8,18})$")
_MARKER_MAX = 24  # bytes: 18 digits (an int64 step) and surrounding whitespace
_MARKER_RE = re.compile(rb"\s*[0-9]{1,18}\s*")


# An iteration directory's number has at most 18 digits (an int64 step): what loading and the
# marker accept, so what saving accepts too.
MAX_ITERATION = 10 ** 18 - 1


def check_iteration(iteration, what: str = "iteration") -> int:
    """`iteration` as an int in [0, MAX_ITERATION]; CheckpointError (one line) otherwise."""
    import numbers

    if isinstance(iteration, bool) or not isinstance(iteration, numbers.Integral) \
            or not 0 <= iteration <= MAX_ITERATION:
        raise CheckpointError(f"{what} must be an integer in [0, {MAX_ITERATION}] (at most 18 digits), "
                              f"got {iteration!r}")
    return int(iteration)


def iteration_name(iteration: int) -> str:
    return f"iteration_{iteration:08d}"


def staging_name(iteration: int, token: str) -> str:
    return f".{iteration_name(iteration)}.{token}.incomplete"


def replaced_name(iteration: int) -> str:
    return f".{iteration_name(iteration)}.replaced"


def trash_name(name: str, token: str) -> str:
    return f".{name.lstrip('.')}.{token}.trash"


def shard_file(prefix: str, part: str, rank: int, world: int) -> str:
    kind = {"model": "model", "optimizer": "opt"}[part]
    return f"{prefix}-{kind}-{rank:07d}-{world:07d}.safetensors"


def read_marker(root: Path) -> int | None:
    """The committed iteration, None if there is no marker; a corrupt marker is an error.

    The marker is a few ASCII digits. Whatever else it holds (it may be a symlink to any file)
    is described, never quoted: an error message must not carry another file's bytes.
    """
    path = Path(root) / MARKER
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise CheckpointError(f"{path}: not a regular file (expected the committed iteration number)")
        with open(path, "rb") as f:
            raw = f.read(_MARKER_MAX + 1)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror or e})") from None
    if not _MARKER_RE.fullmatch(raw):
        what = f"more than {_MARKER_MAX} bytes" if len(raw) > _MARKER_MAX else "something else"
        raise CheckpointError(f"{path}: does not hold an iteration number (expected up to 18 ASCII digits, found {what})")
    return int(raw)


def write_marker(root: Path, iteration: int, *, fsync: bool = True) -> None:
    atomic_write_bytes(Path(root) / MARKER, f"{iteration}\n".encode(), fsync=fsync)


def committed_dirs(root: Path) -> dict[int, Path]:
    """{iteration: directory} for every `iteration_N` directory under root."""
    out = {}
    if Path(root).is_dir():
        for p in Path(root).iterdir():
            m = _ITER_RE.match(p.name)
            if m and p.is_dir():
                out[int(m.group(1))] = p
    return out


def iteration_dir(root: Path, iteration: int) -> Path:
    """The directory of a committed iteration, falling back to the copy kept while it is re-saved."""
    root = Path(root)
    path = root / iteration_name(iteration)
    if path.is_dir():
        return path
    kept = root / replaced_name(iteration)
    if kept.is_dir():
        return kept
    raise CheckpointError(f"{root}: checkpoint directory {iteration_name(iteration)} is missing")


def committed_checkpoint(save_path: str | Path) -> Path | None:
    """The directory of the checkpoint committed in `save_path` (the one its marker names: what a
    resume loads), None when nothing is committed there. Reads the marker only, so it answers
    while another process writes the next checkpoint; a corrupt marker is a CheckpointError."""
    iteration = read_marker(Path(save_path))
    return None if iteration is None else iteration_dir(Path(save_path), iteration)


def resolve(path: Path, iteration: int | None = None) -> tuple[Path, int]:
    """(iteration directory, iteration) for a save directory or an iteration directory."""
    path = Path(path)
    if (path / METADATA).is_file():
        m = re.match(r"^\.?iteration_([0-9]{8,18})", path.name)
        found = int(m.group(1)) if m else None
        if iteration is not None and found is not None and iteration != found:
            raise CheckpointError(f"{path}: is iteration {found}, not {iteration}")
        return path, found if found is not None else (iteration or 0)
    if iteration is None:
        iteration = read_marker(path)
        if iteration is None:
            raise CheckpointError(f"{path}: no {MARKER} (no committed checkpoint) and no {METADATA}")
    return iteration_dir(path, iteration), iteration
