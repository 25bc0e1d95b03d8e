"""Files the `mf` commands write for the user (a migrated YAML, a report, a PNG): written whole or
not at all, with the permissions any file the user makes gets.

A temporary file beside the target, renamed over it once complete, so a failure midway leaves the
old file as it was. tempfile makes that file 0600 whatever the umask; the result is given 0666
less the umask, as `open()` would (a report is meant to be read by the others who read the run).
"""

from __future__ import annotations

import os
import tempfile


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomically(path: str | os.PathLike, data: bytes | str) -> None:
    """Write `data` to `path` (see the module docstring); OSError when it cannot be written."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
