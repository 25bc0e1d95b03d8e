"""`--set KEY=VALUE` overrides, applied to the raw YAML mapping before validation.

KEY is a path of mapping keys and list indices: `training.steps`, `callbacks[0].type`,
`callbacks.0.type`, and `recompute_comm.select_module['attention.qkv']` for a key that itself
contains a dot. VALUE is YAML (`20`, `1e-4`, `[0.9, 0.99]`, `null`, `'text'`); an empty VALUE is
the empty string. Missing mappings on the way are created; a list can grow by one item at a time
(index == its length appends). Because validation runs after, a misspelt key is reported by the
schema with a did-you-mean, exactly as if it were in the file.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from mf_config.errors import ConfigError, fmt_value
from mf_config.schema import child_path
from mf_config.yaml_io import parse_scalar

_NAME = re.compile(r"[^.\[\]]+")
_BRACKET = re.compile(r"\[\s*(?:(\d+)|'([^']*)'|\"([^\"]*)\")\s*\]")


def parse_key(key: str, source: str) -> list[str | int]:
    """`a.b[0]['c.d']` -> ['a', 'b', 0, 'c.d']; bare all-digit names are list indices."""
    parts: list[str | int] = []
    i = 0
    while i < len(key):
        if key[i] == "[":
            match = _BRACKET.match(key, i)
            if match is None:
                raise ConfigError(source, "malformed key: brackets hold a list index or a quoted key, e.g. [0] or ['a.b']")
            index, single, double = match.groups()
            parts.append(int(index) if index is not None else (single if single is not None else double))
            i = match.end()
        else:
            if parts:
                if key[i] != ".":
                    raise ConfigError(source, f"malformed key: expected '.' or '[' at character {i + 1}")
                i += 1
            match = _NAME.match(key, i)
            if match is None:
                raise ConfigError(source, "malformed key: empty key name")
            name = match.group().strip()
            if not name:
                raise ConfigError(source, "malformed key: empty key name")
            parts.append(int(name) if name.isdigit() else name)
            i = match.end()
    if not parts:
        raise ConfigError(source, "malformed override: the key is empty")
    if isinstance(parts[0], int):
        raise ConfigError(source, "malformed key: the top level is a mapping of sections, not a list")
    return parts


def _path(parts: list[str | int]) -> str:
    path = ""
    for part in parts:
        path = child_path(path, part)
    return path


def _container_for(next_part: str | int) -> Any:
    return [] if isinstance(next_part, int) else {}


def _step(node: Any, part: str | int, parts: list[str | int], depth: int, source: str, value: Any) -> Any:
    """Descend from `node` by `part` (creating the child when missing), or assign `value` when
    `part` is the last one. Returns the child."""
    last = depth == len(parts) - 1
    here = _path(parts[:depth]) or "the top level"
    if isinstance(node, dict):
        key = str(part)
        if last:
            node[key] = value
            return value
        if node.get(key) is None:
            node[key] = _container_for(parts[depth + 1])
        return node[key]
    if isinstance(node, list):
        if not isinstance(part, int):
            raise ConfigError(source, f"{here} is a list: address its items by index, e.g. {here}[0]")
        if part > len(node):
            raise ConfigError(source, f"{here} has {len(node)} item(s): index {part} is out of range "
                                      f"(use {len(node)} to append)")
        if part == len(node):
            node.append(value if last else _container_for(parts[depth + 1]))
        elif last:
            node[part] = value
        elif node[part] is None:
            node[part] = _container_for(parts[depth + 1])
        return node[part]
    raise ConfigError(source, f"{here} is {fmt_value(node)}, not a mapping or list, so it has no key {part!r}")


def apply_override(raw: dict, override: str) -> None:
    """Apply one `KEY=VALUE` to `raw` in place."""
    source = f"--set {override}"
    if not isinstance(override, str) or "=" not in override:
        raise ConfigError(f"--set {override}", "expected KEY=VALUE, e.g. training.steps=20")
    key, _, text = override.partition("=")
    parts = parse_key(key.strip(), source)
    value = parse_scalar(text, source)
    node: Any = raw
    for depth, part in enumerate(parts):
        node = _step(node, part, parts, depth, source, value)


def apply_overrides(raw: dict, overrides: Iterable[str]) -> dict:
    """Apply every override in order (later ones win) to `raw` in place and return it."""
    for override in overrides:
        apply_override(raw, override)
    return raw
