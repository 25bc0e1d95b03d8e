"""Filesystem helpers: names that cannot escape a directory, atomic files and output directories."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .errors import CheckpointError


def safe_member(root: Path, name: object, what: str = "file name") -> Path:
    """`root / name` if `name` is a plain file name that resolves inside `root`.

    Rejects absolute paths, separators, `..`, and symlinks pointing outside `root`: a checkpoint's
    metadata must never make us read (or later delete) anything else on the machine.
    """
    if not isinstance(name, str) or not name or name in (".", ".."):
        raise CheckpointError(f"{root}: invalid {what} {name!r}")
    if "/" in name or "\\" in name or "\x00" in name or os.path.isabs(name):
        raise CheckpointError(f"{root}: {what} {name!r} is not a plain file name inside the checkpoint directory")
    path = root / name
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if os.path.commonpath([real_root, real]) != real_root:
        raise CheckpointError(f"{root}: {what} {name!r} resolves outside the checkpoint directory ({real})")
    return path


def fsync_dir(path: Path) -> None:
    """Make a rename or creation inside `path` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, *, fsync: bool = True) -> None:
    """Write `data` to a temp file beside `path`, then rename over it: readers see old or new."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if fsync:
        fsync_dir(path.parent)


def write_json(path: Path, obj, *, fsync: bool = True) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8"), fsync=fsync)


def read_json(path: Path, what: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: {what} not found") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read {what} ({e.strerror or e})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: {what} is not valid JSON ({e})") from None


def check_output_dir(out_dir: Path, *, overwrite: bool) -> None:
    """Refuse a non-empty destination unless overwriting was asked for (checked before any work)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise CheckpointError(f"{out_dir}: exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise CheckpointError(f"{out_dir}: directory is not empty (use --force / overwrite=True to replace it)")


@contextlib.contextmanager
def atomic_output_dir(out_dir: str | os.PathLike, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temp directory beside `out_dir`; on success it replaces `out_dir` in one rename.

    On failure the temp directory is removed and `out_dir` is untouched. With `overwrite`, an
    existing `out_dir` is moved aside first and deleted only after the new one is in place.
    """
    out_dir = Path(out_dir)
    check_output_dir(out_dir, overwrite=overwrite)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if out_dir.exists():
        if any(out_dir.iterdir()):
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".old", dir=out_dir.parent))
            os.rmdir(old)
            os.replace(out_dir, old)
        else:
            os.rmdir(out_dir)
    os.replace(tmp, out_dir)
    fsync_dir(out_dir.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
