"""Filesystem helpers: names that cannot escape a directory, atomic files and output directories."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
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


def _temp_name(directory: Path, name: str, suffix: str) -> Path:
    return Path(directory) / f".{name}.{secrets.token_hex(6)}{suffix}"


def make_temp_dir(directory: Path, name: str, suffix: str) -> Path:
    """A new, uniquely named directory `.name.<random><suffix>` in `directory`, created with the
    usual permissions (0777 less the umask, like `mkdir`): tempfile.mkdtemp's 0700 would carry over
    to an output directory renamed into place."""
    for _ in range(100):
        path = _temp_name(directory, name, suffix)
        try:
            os.mkdir(path, 0o777)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"{directory}: cannot find a free temporary name for {name}")


def _create_temp_file(directory: Path, name: str) -> tuple[int, str]:
    # 0666 less the umask, like open(): tempfile.mkstemp's 0600 would survive the rename.
    for _ in range(100):
        path = _temp_name(directory, name, ".tmp")
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), str(path)
        except FileExistsError:
            continue
    raise FileExistsError(f"{directory}: cannot find a free temporary name for {name}")


def atomic_write_bytes(path: Path, data: bytes, *, fsync: bool = True) -> None:
    """Write `data` to a temp file beside `path`, then rename over it: readers see old or new."""
    path = Path(path)
    fd, tmp = _create_temp_file(path.parent, path.name)
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


# Far deeper than anything mf-ckpt writes (common.json nests a few levels); json's own limit is the
# interpreter's recursion limit, and a RecursionError is no message for a user.
MAX_JSON_DEPTH = 64


def json_depth_ok(value, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when `value` nests at most `limit` containers deep (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return False
            children = item.values() if isinstance(item, dict) else item
            stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return True


def loads_json(raw: bytes | str, where: str, what: str):
    """Parse JSON read from a file; any problem (syntax, encoding, nesting) is one CheckpointError."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise CheckpointError(f"{where}: {what} nests too deeply to be read") from None
    except (ValueError, UnicodeDecodeError) as e:     # ValueError: also an integer of 5000 digits
        raise CheckpointError(f"{where}: {what} is not valid JSON ({e})") from None
    if not json_depth_ok(value):
        raise CheckpointError(f"{where}: {what} nests more than {MAX_JSON_DEPTH} levels deep")
    return value


def read_json(path: Path, what: str):
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: {what} not found") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read {what} ({e.strerror or e})") from None
    return loads_json(raw, str(path), what)


def check_not_an_input(out_dir, inputs, flag: str = "OUT") -> None:
    """Refuse an output directory that is one of the inputs, holds one, or lies inside one: with
    --force it would be replaced (deleted) while, or before, it is read."""
    out_real = os.path.realpath(out_dir)
    for given in inputs:
        if given is None:
            continue
        src_real = os.path.realpath(given)
        if out_real == src_real:
            raise CheckpointError(f"{out_dir}: {flag} is the input {given} itself; write somewhere else")
        if os.path.commonpath([out_real, src_real]) == out_real:
            raise CheckpointError(f"{out_dir}: {flag} contains the input {given}; replacing it would destroy the input")
        if os.path.commonpath([out_real, src_real]) == src_real:
            raise CheckpointError(f"{out_dir}: {flag} lies inside the input {given}; write somewhere else")


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
    tmp = make_temp_dir(out_dir.parent, out_dir.name, ".tmp")
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if out_dir.exists():
        if any(out_dir.iterdir()):
            old = _temp_name(out_dir.parent, out_dir.name, ".old")
            os.replace(out_dir, old)
        else:
            os.rmdir(out_dir)
    os.replace(tmp, out_dir)
    fsync_dir(out_dir.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
