"""Reading and writing YAML text, with errors that say where.

The loader is PyYAML's safe loader with the changes a config file needs:
- a key written twice in one mapping is an error (plain PyYAML silently keeps the last one);
- `1e-5` is a float, as in YAML 1.2 (plain PyYAML reads an exponent without a dot as a string,
  which would hand `rms_norm_eps: 1e-6` to a model as the text "1e-6");
- `1:30` is the string it looks like, as in YAML 1.2 (YAML 1.1 reads it as 90, base 60);
- what no config holds is refused in one line instead of a traceback or a hang: a file over
  MAX_YAML_BYTES (or /dev/zero), nesting deeper than the parser recurses, an integer of more
  digits than Python converts (and, with `check_aliases`, an alias that refers to itself or
  expands to more than MAX_YAML_VALUES values).
The dumper writes the same dialect: strings that would read back as numbers are quoted, and lists
of scalars are written inline (`betas: [0.9, 0.95]`).
"""

from __future__ import annotations

import os
import re
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode

from mf_config.errors import ConfigError

# YAML 1.2 floats that YAML 1.1 misses: an exponent with no '.' in the mantissa (1e-5, 3E+2).
_EXP_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$")
_FLOAT_TAG = "tag:yaml.org,2002:float"
_MERGE_TAG = "tag:yaml.org,2002:merge"


# A config is kilobytes: a MindFormers run_xxx.yaml ~20 KB. Beyond these it is not a config.
MAX_YAML_BYTES = 4 << 20
MAX_YAML_VALUES = 1_000_000
_MAX_INT_DIGITS = 4300      # CPython's default int <-> str limit

# YAML 1.1's int and float resolvers without their base-60 forms (1:30 -> 90), as in YAML 1.2.
_INT_TAG = "tag:yaml.org,2002:int"
_INT = re.compile(r"""^(?:[-+]?0b[0-1_]+
                    |[-+]?0[0-7_]+
                    |[-+]?(?:0|[1-9][0-9_]*)
                    |[-+]?0x[0-9a-fA-F_]+)$""", re.X)
_FLOAT = re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
                    |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
                    |[-+]?\.(?:inf|Inf|INF)
                    |\.(?:nan|NaN|NAN))$""", re.X)


class _Loader(yaml.SafeLoader):
    def construct_yaml_int(self, node: Any) -> int:
        digits = sum(ch.isalnum() for ch in str(node.value))
        if digits > _MAX_INT_DIGITS:
            raise ConstructorError(None, None, f"an integer of {digits} digits (at most {_MAX_INT_DIGITS})",
                                   node.start_mark)
        return super().construct_yaml_int(node)

    def construct_mapping(self, node: Any, deep: bool = False) -> dict:
        if isinstance(node, MappingNode):
            seen: set = set()
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                except TypeError:  # unhashable key: the base class reports it
                    continue
                if duplicate:
                    raise ConstructorError(None, None, f"found duplicate key {key!r}", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True  # a resolved config is written out in full, never with &anchors / *aliases


def _represent_list(dumper: yaml.SafeDumper, data: list) -> Any:
    inline = bool(data) and all(not isinstance(v, (list, dict)) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=inline)


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_INT_TAG, _FLOAT_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(_INT_TAG, _INT, list("-+0123456789"))
_Loader.add_implicit_resolver(_FLOAT_TAG, _FLOAT, list("-+0123456789."))
_Loader.add_constructor(_INT_TAG, _Loader.construct_yaml_int)
for _cls in (_Loader, _Dumper):
    _cls.add_implicit_resolver(_FLOAT_TAG, _EXP_FLOAT, list("-+0123456789"))
_Dumper.add_representer(list, _represent_list)


def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "unknown position"


def check_aliases(data: Any, source: str) -> None:
    """Refuse an alias that contains itself (nothing could walk it) or that expands past
    MAX_YAML_VALUES values (a "billion laughs" file), counted as a walk would see them: for
    readers that walk the whole file (the legacy migration); load_config's schema does the same
    per key, naming the key path."""
    seen = 0
    stack: list[tuple[Any, frozenset]] = [(data, frozenset())]
    while stack:
        value, inside = stack.pop()
        seen += 1
        if seen > MAX_YAML_VALUES:
            raise ConfigError(source, f"invalid YAML: its aliases expand to more than {MAX_YAML_VALUES:,} values")
        if isinstance(value, (dict, list)):
            if id(value) in inside:
                raise ConfigError(source, "invalid YAML: an alias refers to a mapping or list that contains it")
            children = value.values() if isinstance(value, dict) else value
            inner = inside | {id(value)}
            stack.extend((child, inner) for child in children if isinstance(child, (dict, list)))
            seen += sum(1 for child in children if not isinstance(child, (dict, list)))


def parse_yaml(text: str, source: str) -> Any:
    """Parse YAML text; syntax errors become a one-line ConfigError naming `source` and the line."""
    try:
        data = yaml.load(text, Loader=_Loader)  # _Loader is a SafeLoader: no arbitrary objects
    except RecursionError:
        raise ConfigError(source, "invalid YAML: nested deeper than a config can be") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        if exc.context and problem.startswith("but "):  # "expected X" + "but found Y" read as one
            problem = f"{exc.context} {problem}"
        elif exc.context and exc.context_mark is not None and mark is not None and exc.context_mark.line != mark.line:
            # An unclosed bracket or quote is detected lines later: say where it was opened.
            problem = f"{problem} ({exc.context} at {_where(exc.context_mark)})"
        raise ConfigError(source, f"invalid YAML at {_where(mark)}: {problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(source, f"invalid YAML: {exc}") from None
    return data


def read_yaml(path: str | os.PathLike) -> Any:
    """Read and parse a YAML file; every failure is a one-line ConfigError naming the file."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)      # bounded: /dev/zero or a huge file is not read whole
        if len(raw) > MAX_YAML_BYTES:
            raise ConfigError(name, f"is larger than {MAX_YAML_BYTES >> 20} MiB: not a config file")
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(name, "no such file") from None
    except IsADirectoryError:
        raise ConfigError(name, "is a directory, not a YAML file") from None
    except UnicodeDecodeError:
        raise ConfigError(name, "is not UTF-8 text") from None
    except OSError as exc:
        raise ConfigError(name, f"cannot be read ({exc.strerror or exc})") from None
    return parse_yaml(text, name)


def parse_scalar(text: str, source: str) -> Any:
    """A `--set` value: YAML-typed (`20` int, `1e-4` float, `[0.9, 0.99]` list, `null`); an empty
    value is the empty string, which is what `--set checkpoint.load_path=` means."""
    if text.strip() == "":
        return ""
    return parse_yaml(text, source)


def dump_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, default_flow_style=False, width=100)
