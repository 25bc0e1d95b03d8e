"""The schema framework: typed dataclass sections built from plain YAML data.

A section is a keyword-only dataclass deriving from `Section`. Each field's annotation is its
type (bool, int, float, str, Literal[...], X | None, list[X], dict[str, X], another Section, or
Any for free-form data); `fld()` adds a default, a value check and a one-line doc. Building a
section from a mapping:

- rejects unknown keys with a did-you-mean (strict sections) or keeps them in `.extra`
  (sections with `allow_extra = True`, which derive from `ExtraSection`);
- converts nothing silently: bool is not int, a float is not an int, a number is not a string.
  The only conveniences: an int is accepted where a float is expected, and so is a numeric string
  such as "1e-5" (plain PyYAML reads `1e-5` as a string);
- raises `ConfigError` naming the full key path of the first problem found.

Cross-field rules live in `mf_config.rules`; this module knows only single fields.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import difflib
import math
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from typing import Any, ClassVar, Literal, Union

from mf_config.errors import ConfigError, fmt_value, type_name

REQUIRED: Any = dataclasses.MISSING
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What plain YAML data may hold (PyYAML's safe loader produces nothing else).
_PLAIN_SCALARS = (str, int, float, bool, type(None), datetime.date, bytes)

Check = Callable[[Any, str], None]
Pre = Callable[[Any, str], Any]


def child_path(path: str, key: str | int) -> str:
    """`training` + `steps` -> `training.steps`; `callbacks` + 0 -> `callbacks[0]`."""
    if isinstance(key, int) and not isinstance(key, bool):
        return f"{path}[{key}]"
    key = str(key)
    if _IDENT.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def fld(default: Any = REQUIRED, *, check: Check | None = None, pre: Pre | None = None, doc: str = "") -> Any:
    """A section field: `default` (REQUIRED for none), an optional `check(value, path)` run on the
    converted non-null value, an optional `pre(value, path) -> value` run on the raw non-null
    value before type conversion (to normalise spellings, or to give a friendlier message than the
    type check would on structured values), and a one-line `doc`."""
    metadata = {"check": check, "pre": pre, "doc": doc}
    if isinstance(default, (list, dict, Section)):
        # Mutable defaults: every instance gets its own copy.
        snapshot = copy.deepcopy(default)
        return dataclasses.field(default_factory=lambda: copy.deepcopy(snapshot), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(kw_only=True)
class Section:
    """Base of every config section. Strict: unknown keys are errors."""

    allow_extra: ClassVar[bool] = False


@dataclasses.dataclass(kw_only=True)
class ExtraSection(Section):
    """A section that keeps undeclared keys in `extra` and passes them on to its consumer."""

    allow_extra: ClassVar[bool] = True
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def kwargs(self, exclude: Iterable[str] = ("type",)) -> dict[str, Any]:
        """The keyword arguments for the consumer's constructor: the declared fields (minus
        `exclude`, by default the `type` that picks the class) followed by the undeclared keys."""
        skip = set(exclude) | {"extra"}
        out = {f.name: copy.deepcopy(getattr(self, f.name)) for f in declared_fields(type(self)) if f.name not in skip}
        out.update(copy.deepcopy(self.extra))
        return out


def declared_fields(cls: type) -> list[dataclasses.Field]:
    """The fields a user writes in YAML, in declaration order (everything but `extra`)."""
    return [f for f in dataclasses.fields(cls) if f.name != "extra"]


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def field_type(cls: type, name: str) -> Any:
    return _hints(cls)[name]


def is_required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


# ----------------------------------------------------------------------------- type descriptions

def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, Section)


def _union_args(tp: Any) -> tuple | None:
    if typing.get_origin(tp) in (Union, types.UnionType):
        return typing.get_args(tp)
    return None


def describe(tp: Any, plural: bool = False) -> str:
    """`int` -> 'an integer', `list[str] | None` -> 'null or a list of strings'."""
    args = _union_args(tp)
    if args is not None:
        inner = [a for a in args if a is not type(None)]
        text = " or ".join(describe(a, plural) for a in inner)
        return f"null or {text}" if type(None) in args else text
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(c) for c in typing.get_args(tp))
    if origin is list:
        text = f"list{'s' if plural else ''} of {describe(typing.get_args(tp)[0], plural=True)}"
        return text if plural else f"a {text}"
    if origin is dict:
        text = f"mapping{'s' if plural else ''} of names to {describe(typing.get_args(tp)[1], plural=True)}"
        return text if plural else f"a {text}"
    singular, many = {
        bool: ("a boolean (True/False)", "booleans"),
        int: ("an integer", "integers"),
        float: ("a number", "numbers"),
        str: ("a string", "strings"),
    }.get(tp, ("a mapping", "mappings") if _is_section(tp) else ("plain YAML data", "plain YAML data"))
    return many if plural else singular


def _type_error(tp: Any, value: Any, path: str) -> ConfigError:
    return ConfigError(path, f"expected {describe(tp)}, got {_show(value)} ({type_name(value)})")


def _show(value: Any) -> str:
    return fmt_value(value)


# ----------------------------------------------------------------------------- conversion

def convert(tp: Any, value: Any, path: str) -> Any:
    """Check `value` against the type `tp` and return the typed value (ints widened to float for
    float fields, sections built, lists and dicts copied)."""
    args = _union_args(tp)
    if args is not None:
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"unsupported union type {tp!r} at {path}")  # schema bug, not user input
        if value is None:
            raise _type_error(tp, value, path)
        try:
            return convert(inner[0], value, path)
        except ConfigError as exc:
            if exc.key_path == path and exc.problem.startswith("expected "):
                raise _type_error(tp, value, path) from None  # say that null is allowed too
            raise
    if _is_section(tp):
        return build_section(tp, value, path)
    origin = typing.get_origin(tp)
    if origin is Literal:
        return _convert_literal(tp, value, path)
    if origin is list:
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, list):
            raise _type_error(tp, value, path)
        item_tp = typing.get_args(tp)[0]
        return [convert(item_tp, item, child_path(path, i)) for i, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise _type_error(tp, value, path)
        value_tp = typing.get_args(tp)[1]
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConfigError(path, "keys must be strings", key)
            out[key] = convert(value_tp, item, child_path(path, key))
        return out
    if tp is bool:
        if not isinstance(value, bool):
            raise _type_error(tp, value, path)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _type_error(tp, value, path)
        return value
    if tp is float:
        return _convert_float(value, path)
    if tp is str:
        if not isinstance(value, str):
            raise _type_error(tp, value, path)
        return value
    if tp is Any:
        return plain_data(value, path)
    raise TypeError(f"unsupported field type {tp!r} at {path}")  # schema bug, not user input


def _convert_float(value: Any, path: str) -> float:
    if isinstance(value, bool):
        raise _type_error(float, value, path)
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise _type_error(float, value, path) from None
    else:
        raise _type_error(float, value, path)
    if not math.isfinite(number):
        raise ConfigError(path, "must be a finite number", value)
    return number


def _convert_literal(tp: Any, value: Any, path: str) -> Any:
    choices = typing.get_args(tp)
    for choice in choices:
        if type(value) is type(choice) and value == choice:
            return value
    hint = ""
    if isinstance(value, str):
        by_lower = {str(c).lower(): c for c in choices}
        close = difflib.get_close_matches(value.lower(), list(by_lower), n=1, cutoff=0.6)
        if close:
            hint = f"; did you mean {by_lower[close[0]]!r}?"
    raise ConfigError(path, f"must be {describe(tp)}, got {_show(value)}{hint}")


# Pass-through data is copied node by node; YAML aliases can make a small file expand into a huge
# (or, with a self-reference, infinite) structure, so the copy has a budget.
MAX_PLAIN_NODES = 1_000_000


def plain_data(value: Any, path: str, parent: Any = None, budget: list[int] | None = None) -> Any:
    """A deep copy of free-form YAML data (pass-through keys), refusing anything YAML cannot hold,
    self-referencing aliases, and alias expansions beyond MAX_PLAIN_NODES nodes. `parent` is the
    mapping holding `value` (so a reference back to it is caught), `budget` a node count shared
    by several calls."""
    return _plain(value, path, {id(parent)} if parent is not None else set(), budget if budget is not None else [0])


def _plain(value: Any, path: str, ancestors: set[int], budget: list[int]) -> Any:
    budget[0] += 1
    if budget[0] > MAX_PLAIN_NODES:
        raise ConfigError(path, f"holds more than {MAX_PLAIN_NODES} values (YAML aliases expanding?)")
    if isinstance(value, (Mapping, list, tuple)):
        if id(value) in ancestors:
            raise ConfigError(path, "contains itself (a recursive YAML alias)")
        ancestors = ancestors | {id(value)}
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConfigError(path, "keys must be strings", key)
            out[key] = _plain(item, child_path(path, key), ancestors, budget)
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(item, child_path(path, i), ancestors, budget) for i, item in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(path, "must be a finite number", value)
    if isinstance(value, _PLAIN_SCALARS):
        return value
    raise ConfigError(path, f"is not plain YAML data ({type(value).__name__})", value)


def unknown_key_error(path: str, key: str, known: Iterable[str], top_level: bool = False) -> ConfigError:
    known = list(known)
    what = "unknown top-level section" if top_level else "unknown key"
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if close:
        return ConfigError(child_path(path, key), f"{what}; did you mean {close[0]!r}?")
    return ConfigError(child_path(path, key), f"{what} (known: {', '.join(known)})")


def _null_means_default(tp: Any) -> bool:
    """Sections and lists of sections: YAML writes an empty one as a bare `key:` (null)."""
    if _is_section(tp):
        return True
    return typing.get_origin(tp) is list and _is_section(typing.get_args(tp)[0])


def build_section(cls: type[Section], raw: Any, path: str) -> Section:
    """Build the section `cls` from the mapping `raw` (None means all defaults)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(path or "top level", f"expected a mapping of {cls.__name__} keys, got {_show(raw)} ({type_name(raw)})")
    fields = declared_fields(cls)
    names = [f.name for f in fields]
    extra: dict[str, Any] = {}
    budget = [0]
    for key, value in raw.items():
        if not isinstance(key, str):
            raise ConfigError(path or "top level", "keys must be strings", key)
        if key in names:
            continue
        if not cls.allow_extra:
            raise unknown_key_error(path, key, names, top_level=not path)
        extra[key] = plain_data(value, child_path(path, key), parent=raw, budget=budget)
    kwargs: dict[str, Any] = {}
    for f in fields:
        key_path = child_path(path, f.name)
        if f.name not in raw:
            if is_required(f):
                raise ConfigError(key_path, f"required key is missing (expected {describe(field_type(cls, f.name))})")
            continue
        value = raw[f.name]
        tp = field_type(cls, f.name)
        if value is None and _null_means_default(tp):
            continue  # `callbacks:` with nothing after it, like an empty section, means the default
        if f.metadata.get("pre") is not None and value is not None:
            value = f.metadata["pre"](value, key_path)
        value = convert(tp, value, key_path)
        if f.metadata.get("check") is not None and value is not None:
            f.metadata["check"](value, key_path)
        kwargs[f.name] = value
    if cls.allow_extra:
        kwargs["extra"] = extra
    return cls(**kwargs)


def section_to_dict(section: Section) -> dict[str, Any]:
    """Plain data for a section: declared fields in order, then its undeclared keys."""
    out: dict[str, Any] = {}
    for f in declared_fields(type(section)):
        out[f.name] = to_plain(getattr(section, f.name))
    if isinstance(section, ExtraSection):
        out.update(copy.deepcopy(section.extra))
    return out


def to_plain(value: Any) -> Any:
    if isinstance(value, Section):
        return section_to_dict(value)
    if isinstance(value, list):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    return copy.deepcopy(value)


# ----------------------------------------------------------------------------- reusable checks

def positive(value: Any, path: str) -> None:
    if value <= 0:
        raise ConfigError(path, "must be positive", value)


def non_negative(value: Any, path: str) -> None:
    if value < 0:
        raise ConfigError(path, "must be >= 0", value)


def in_range(low: float, high: float, *, low_open: bool = False, high_open: bool = False) -> Check:
    """A check for `low <= v <= high`, either end optionally open; the message shows the interval."""
    text = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"

    def check(value: Any, path: str) -> None:
        below = value <= low if low_open else value < low
        above = value >= high if high_open else value > high
        if below or above:
            raise ConfigError(path, f"must be in {text}", value)

    return check


def non_empty(value: Any, path: str) -> None:
    if len(value) == 0:
        raise ConfigError(path, "must not be empty", value)


def unique(value: list, path: str) -> None:
    seen = set()
    for i, item in enumerate(value):
        if item in seen:
            raise ConfigError(child_path(path, i), "duplicate entry", item)
        seen.add(item)


def each(*checks: Check) -> Check:
    """Apply `checks` to every item of a list, with the item's own path in messages."""

    def check(value: list, path: str) -> None:
        for i, item in enumerate(value):
            for c in checks:
                c(item, child_path(path, i))

    return check


def all_of(*checks: Check) -> Check:
    def check(value: Any, path: str) -> None:
        for c in checks:
            c(value, path)

    return check
