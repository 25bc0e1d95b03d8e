"""Human byte sizes: `2GB` (decimal, as Hugging Face uses), `1GiB` (binary), or a plain integer."""

from __future__ import annotations

import re

from .errors import CheckpointError

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}


def parse_size(value: int | str) -> int:
    """Bytes for `value`; raises CheckpointError naming the bad value."""
    if isinstance(value, bool):
        raise CheckpointError(f"invalid size {value!r}")
    if isinstance(value, int):
        size = value
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(value))
        if not m or m.group(2).lower() not in _UNITS:
            raise CheckpointError(f"invalid size {value!r} (examples: 2GB, 500MB, 1GiB, 1048576)")
        size = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if size <= 0:
        raise CheckpointError(f"size must be positive, got {value!r}")
    return size


def format_size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"
