"""The old mapping, read through an object that remembers which keys a rule has dealt with.

Every rule marks the keys it handles (copied, translated, reported). At the end the engine asks
for the leaves nobody marked and reports each one, so a migration can never drop a key silently.
Paths are tuples of keys (`("parallel_config", "model_parallel")`, `("callbacks", 1, "prefix")`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from mf_config.schema import child_path

Path = tuple[Any, ...]
_MISSING = object()


def show_path(path: Path) -> str:
    """`("callbacks", 1, "prefix")` -> `callbacks[1].prefix`."""
    text = ""
    for key in path:
        text = child_path(text, key)
    return text


class LegacySource:
    def __init__(self, data: dict[str, Any]):
        self.data = data
        self._handled: set[Path] = set()

    # -- reading -------------------------------------------------------------------------------
    def get(self, path: Path, default: Any = None) -> Any:
        node: Any = self.data
        for key in path:
            if isinstance(node, dict) and key in node:
                node = node[key]
            elif isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
                node = node[key]
            else:
                return default
        return node

    def has(self, path: Path) -> bool:
        return self.get(path, _MISSING) is not _MISSING

    def mapping(self, path: Path) -> dict[str, Any]:
        """The mapping at `path`, or {} when it is absent, null or not a mapping."""
        value = self.get(path)
        return value if isinstance(value, dict) else {}

    # -- bookkeeping ---------------------------------------------------------------------------
    def mark(self, path: Path) -> None:
        """`path` (and everything below it) has been dealt with."""
        self._handled.add(tuple(path))

    def is_handled(self, path: Path) -> bool:
        return any(path[:i] in self._handled for i in range(1, len(path) + 1))

    def leaves(self, node: Any = _MISSING, prefix: Path = ()) -> Iterator[Path]:
        """Every leaf path: mappings are walked, and lists of mappings (callbacks); other lists
        are one leaf. An empty mapping is a leaf of its own."""
        node = self.data if node is _MISSING else node
        if isinstance(node, dict) and node:
            for key, value in node.items():
                yield from self.leaves(value, (*prefix, key))
        elif isinstance(node, list) and node and any(isinstance(v, dict) for v in node):
            for i, value in enumerate(node):
                yield from self.leaves(value, (*prefix, i))
        elif prefix:
            yield prefix

    def unhandled(self) -> list[Path]:
        return [path for path in self.leaves() if not self.is_handled(path)]
