"""Reading jsonl corpora (plain or gzip): documents with line numbers, bad lines counted.

A line is a document when it is a JSON object whose every requested key holds a string (or a
list of strings: pre-split sentences, kept as separate sequences of one document, as Megatron's
preprocessing does). Blank lines are skipped. Anything else is a bad line: fatal with
`strict=True` (one error naming file and line), otherwise counted and reported.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO

from .errors import InputError

try:  # part of the `tokenizer` extra: parses a line ~3x faster than the standard library
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - depends on the environment
    _fast_loads = None

_GZIP_MAGIC = b"\x1f\x8b"


def open_binary(path: str) -> IO[bytes]:
    """The file's bytes, gunzipped when it starts with the gzip magic (whatever its name)."""
    if not os.path.isfile(path):
        raise InputError(f"{path}: input file not found")
    with open(path, "rb") as probe:
        magic = probe.read(2)
    return gzip.open(path, "rb") if magic == _GZIP_MAGIC else open(path, "rb")


class LineError(ValueError):
    """Why one line is not a usable document."""


def _parse(line: bytes) -> object:
    """The standard library's verdict, reached through orjson when it agrees (almost always)."""
    if _fast_loads is not None:
        try:
            return _fast_loads(line)
        except ValueError:
            pass  # e.g. NaN literals or lone surrogates, which json accepts: let it decide and explain
    try:
        obj = json.loads(line.decode("utf-8"))  # str input skips json's encoding detection
    except UnicodeDecodeError:
        raise LineError("not valid UTF-8") from None
    except RecursionError:
        raise LineError("JSON nested too deeply") from None
    except ValueError as err:
        raise LineError(f"invalid JSON ({str(err).split(':')[0]})") from None
    _check_strings(obj)
    return obj


def _check_strings(obj: object) -> None:
    """json accepts `"\\ud800"` (a lone surrogate), which no tokenizer can encode: a bad line, not
    a crash later. Only lines orjson refused get here (it rejects them itself). Iterative."""
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise LineError("a string holds a lone surrogate (not encodable as UTF-8)") from None
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def parse_json_line(line: bytes) -> object | None:
    """The JSON value of one line; None for a blank line; LineError when it is not JSON."""
    if not line.strip():
        return None
    return _parse(line)


def parse_line(line: bytes, json_keys: Sequence[str]) -> dict[str, str | list[str]] | None:
    """The requested fields of one line; None for a blank line; LineError when unusable."""
    obj = parse_json_line(line)
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise LineError(f"expected a JSON object, got {type(obj).__name__}")
    out: dict[str, str | list[str]] = {}
    for key in json_keys:
        if key not in obj:
            raise LineError(f"missing key {key!r}")
        value = obj[key]
        if isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            out[key] = value
        else:
            raise LineError(f"key {key!r} holds {type(value).__name__}, expected a string")
    return out


def parse_lines(lines: Sequence[bytes], json_keys: Sequence[str]) -> tuple[list[dict[str, str | list[str]]], list[tuple[int, str]]]:
    """`parse_line` over many lines: (documents, [(line offset, reason) for each bad line]).

    A document is a mapping holding at least the requested keys, each a string or a list of
    strings (the common line's own parsed object, extra keys included: building a dict of the
    requested keys alone cost as much as the check). The common line (orjson parses it into an
    object whose requested keys all hold strings) is handled inline; anything else goes through
    `parse_line`, so the verdicts are the same."""
    docs: list[dict[str, str | list[str]]] = []
    bad: list[tuple[int, str]] = []
    keys = tuple(json_keys)
    fast = _fast_loads
    for offset, line in enumerate(lines):
        if fast is not None:
            try:
                obj = fast(line)
            except ValueError:
                obj = None
            if type(obj) is dict:
                for key in keys:
                    if type(obj.get(key)) is not str:
                        break
                else:
                    docs.append(obj)
                    continue
        try:
            doc = parse_line(line, json_keys)
        except LineError as err:
            bad.append((offset, str(err)))
            continue
        if doc is not None:
            docs.append(doc)
    return docs, bad


@dataclass
class BadLines:
    """Bad lines seen so far: the count and the first few locations."""

    keep: int = 10
    count: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, where: str, reason: str) -> None:
        self.count += 1
        if len(self.examples) < self.keep:
            self.examples.append(f"{where}: {reason}")

    def record(self, lines, strict: bool) -> None:
        """Add a chunk's bad `(path, line number, reason)` lines; with `strict` the first one is an
        InputError instead (`--strict`)."""
        for path, number, reason in lines:
            if strict:
                raise InputError(f"{path}:{number}: {reason} (--strict)")
            self.add(f"{path}:{number}", reason)

    def summary(self) -> str:
        more = f" (and {self.count - len(self.examples)} more)" if self.count > len(self.examples) else ""
        return f"skipped {self.count} bad line(s): " + "; ".join(self.examples) + more


def read_lines(path: str) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw line) of one input file. A damaged file (a gzip stream cut short
    or corrupt, a read error) is one InputError naming the file and where it stopped."""
    number = 0
    try:
        with open_binary(path) as f:
            for number, line in enumerate(f, start=1):
                yield number, line
    except EOFError:
        raise InputError(f"{path}: the gzip stream ends before its end marker (truncated after line {number})") from None
    except (gzip.BadGzipFile, zlib.error) as err:
        raise InputError(f"{path}: corrupt gzip data after line {number} ({err})") from None
    except OSError as err:
        raise InputError(f"{path}: cannot read after line {number} ({err.strerror or err})") from None


def read_line_chunks(path: str, max_lines: int, block_bytes: int = 1 << 20) -> Iterator[tuple[int, list[bytes]]]:
    """(1-based number of the first line, up to `max_lines` raw lines without their b"\\n") of one
    input file, in order: `read_lines` in bulk. Lines are split from 1 MiB reads by bytes.split,
    in C: iterating a file line by line was 7% of `mf-data preprocess`'s Python work, all of it
    holding the GIL the encoding threads need between batches. Errors as in `read_lines`."""
    number = 0          # lines handed out so far
    pending: list[bytes] = []
    tail = b""
    try:
        with open_binary(path) as f:
            while True:
                block = f.read(block_bytes)
                if not block:
                    break
                lines = (tail + block).split(b"\n")
                tail = lines.pop()  # the unfinished last line (b"" after a newline)
                pending.extend(lines)
                while len(pending) >= max_lines:
                    yield number + 1, pending[:max_lines]
                    number += max_lines
                    pending = pending[max_lines:]
    except EOFError:
        raise InputError(f"{path}: the gzip stream ends before its end marker (truncated after line "
                         f"{number + len(pending)})") from None
    except (gzip.BadGzipFile, zlib.error) as err:
        raise InputError(f"{path}: corrupt gzip data after line {number + len(pending)} ({err})") from None
    except OSError as err:
        raise InputError(f"{path}: cannot read after line {number + len(pending)} ({err.strerror or err})") from None
    if tail:
        pending.append(tail)
    if pending:
        yield number + 1, pending


def iter_lines(paths: Iterable[str]) -> Iterator[tuple[str, int, bytes]]:
    """(path, 1-based line number, raw line) over every input file."""
    for path in paths:
        for number, line in read_lines(path):
            yield path, number, line


def iter_documents(
    paths: Sequence[str], json_keys: Sequence[str], strict: bool, stats: dict[str, int] | None = None,
    bad: BadLines | None = None,
) -> Iterator[dict[str, str | list[str]]]:
    bad = bad if bad is not None else BadLines()
    docs = 0
    for path, number, line in iter_lines(paths):
        try:
            doc = parse_line(line, json_keys)
        except LineError as err:
            if strict:
                raise InputError(f"{path}:{number}: {err}") from None
            bad.add(f"{path}:{number}", str(err))
            continue
        if doc is not None:
            docs += 1
            yield doc
    if stats is not None:
        stats.update(documents=docs, bad_lines=bad.count)
