"""The on-disk cache of index arrays, shared by the ranks of a job.

Files are named the Megatron way, `<md5>-<Class>-<split>-<name>.npy` plus
`<md5>-<Class>-<split>-description.txt`, where the md5 is taken over the description: a JSON of
everything the arrays depend on. Each file is written under a temporary name and renamed into
place (atomic on one filesystem); the description goes last and marks the set complete.

One rank builds (`is_built_on_rank()` is True there); the others poll until the files appear
and memory-map them, or fail after `timeout` seconds with an error that says what they waited
for. Every load checks the files against what the description implies (dtype, shape, readable
`.npy` header, matching description text): a corrupt or partial cache is rebuilt by the building
rank, and the others keep waiting for the rebuilt one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import CacheTimeoutError, DataFileError
from .fsutil import atomic_write

logger = logging.getLogger("mf_data")

CACHE_FORMAT_VERSION = 1


def describe(identifiers: Mapping[str, Any]) -> tuple[str, str]:
    """(description text, md5 hex) of an ordered mapping, as Megatron names its caches."""
    text = json.dumps(identifiers, indent=4, default=_jsonable)
    return text, hashlib.md5(text.encode("utf-8"), usedforsecurity=False).hexdigest()


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if hasattr(obj, "unique_identifiers"):
        return obj.unique_identifiers
    raise TypeError(f"cannot describe {type(obj).__name__}")


@dataclass(frozen=True)
class Expected:
    """What a cached array must look like: allowed dtypes and shape (None: any size on that axis,
    for arrays whose length is only known once built, such as packed SFT rows)."""

    dtypes: tuple[type[np.generic], ...]
    shape: tuple[int | None, ...]

    def matches(self, shape: tuple[int, ...]) -> bool:
        return len(shape) == len(self.shape) and all(e is None or e == a for e, a in zip(self.shape, shape))


class IndexCache:
    """The set of `.npy` files (and description) for one dataset split."""

    def __init__(self, directory: str, base: str, description: str, names: tuple[str, ...]) -> None:
        self.directory = directory
        self.base = base
        self.description = description
        self.names = names

    def path(self, name: str) -> str:
        return os.path.join(self.directory, f"{self.base}-{name}")

    @property
    def description_path(self) -> str:
        return self.path("description.txt")

    def npy_path(self, name: str) -> str:
        return self.path(f"{name}.npy")

    def try_load(
        self, expected: Mapping[str, Expected], validate: Callable[[dict[str, np.ndarray]], str] | None = None
    ) -> tuple[dict[str, np.ndarray] | None, str]:
        """(arrays, "") when the cache is complete and sound, else (None, reason). `validate`
        returns a reason (or "") for checks across arrays."""
        if not os.path.isfile(self.description_path):
            return None, "missing"
        try:
            with open(self.description_path, encoding="utf-8") as f:
                text = f.read()
        except OSError as err:
            return None, f"unreadable description ({err})"
        if text != self.description:
            return None, "description differs from this dataset's"
        arrays: dict[str, np.ndarray] = {}
        for name in self.names:
            path = self.npy_path(name)
            try:
                arr = np.load(path, mmap_mode="r", allow_pickle=False)
            except FileNotFoundError:
                return None, f"{os.path.basename(path)} missing"
            except (OSError, ValueError) as err:
                return None, f"{os.path.basename(path)} unreadable ({err})"
            exp = expected[name]
            if arr.dtype.type not in exp.dtypes:
                return None, f"{os.path.basename(path)} has dtype {arr.dtype}, expected {np.dtype(exp.dtypes[0])}"
            if not exp.matches(tuple(arr.shape)):
                return None, f"{os.path.basename(path)} has shape {arr.shape}, expected {exp.shape}"
            arrays[name] = arr
        if validate is not None:
            reason = validate(arrays)
            if reason:
                return None, reason
        return arrays, ""

    def save(self, arrays: Mapping[str, np.ndarray]) -> None:
        os.makedirs(self.directory, exist_ok=True)
        for name in self.names:
            atomic_write(self.npy_path(name), lambda f, a=arrays[name]: np.save(f, a, allow_pickle=False))
        atomic_write(self.description_path, lambda f: f.write(self.description.encode("utf-8")))


def directory_writable(path: str) -> bool:
    """Whether `path` exists as a writable directory or could be created as one."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return False
        probe = parent
    return os.path.isdir(probe) and os.access(probe, os.W_OK | os.X_OK)


def load_or_build(
    cache: IndexCache | None,
    expected: Mapping[str, Expected],
    build: Callable[[], dict[str, np.ndarray]],
    is_built_on_rank: Callable[[], bool],
    timeout: float,
    what: str,
    validate: Callable[[dict[str, np.ndarray]], str] | None = None,
) -> dict[str, np.ndarray]:
    """The arrays of `what`: from the cache, built here, or waited for (see module docstring)."""
    if cache is None:
        return build()
    if is_built_on_rank():
        arrays, reason = cache.try_load(expected, validate)
        if arrays is not None:
            logger.info("loaded %s indices from %s", what, cache.directory)
            return arrays
        if reason != "missing":
            logger.warning("index cache of %s in %s is unusable (%s): rebuilding it", what, cache.directory, reason)
        arrays = build()
        try:
            cache.save(arrays)
        except OSError as err:
            raise DataFileError(
                f"{cache.directory}: cannot write the index cache ({err.strerror or err}); set path_to_cache "
                "to a writable directory"
            ) from None
        logger.info("built %s indices and cached them in %s", what, cache.directory)
        return arrays
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        arrays, reason = cache.try_load(expected, validate)
        if arrays is not None:
            return arrays
        if time.monotonic() >= deadline:
            raise CacheTimeoutError(
                f"{cache.description_path}: gave up after {timeout:g} s waiting for the {what} index cache "
                f"({reason}); this rank does not build it (is_built_on_rank() is False) - check the building "
                "rank, or that path_to_cache is a directory every rank shares"
            )
        time.sleep(delay)
        delay = min(1.0, delay * 1.5)
