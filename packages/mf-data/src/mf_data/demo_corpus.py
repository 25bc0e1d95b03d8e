"""A real English corpus with no download: the help topics that ship with Python.

`pydoc_data.topics` holds the text of the language reference sections shown by `help()`. Each
topic is cut at blank lines into documents of at least `min_chars` characters (whole paragraphs),
written in sorted topic order as `{"id": "<topic>/<n>", "text": ...}` lines. The output is a pure
function of the Python version's topics, so it is identical on every machine with that version.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

from .errors import InputError
from .fsutil import atomic_write_bytes

CORPUS_NAME = "corpus.jsonl"


def demo_documents(min_chars: int = 1000) -> Iterator[dict[str, str]]:
    from pydoc_data.topics import topics

    for topic in sorted(topics):
        paragraphs = [p.strip("\n") for p in topics[topic].split("\n\n") if p.strip()]
        current: list[str] = []
        size, n = 0, 0
        for paragraph in paragraphs:
            current.append(paragraph)
            size += len(paragraph)
            if size >= min_chars:
                yield {"id": f"{topic}/{n}", "text": "\n\n".join(current)}
                current, size, n = [], 0, n + 1
        if current:
            yield {"id": f"{topic}/{n}", "text": "\n\n".join(current)}


def make_demo_corpus(directory: str, overwrite: bool = False, min_chars: int = 1000) -> dict[str, object]:
    """Write `<directory>/corpus.jsonl`; returns its path and size figures."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise InputError(f"{directory}: exists and is not a directory")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, CORPUS_NAME)
    if os.path.exists(path) and not overwrite:
        raise InputError(f"{path}: exists; refusing to overwrite (pass --overwrite)")
    docs = list(demo_documents(min_chars))
    data = "".join(json.dumps(d, ensure_ascii=False, sort_keys=True) + "\n" for d in docs).encode("utf-8")
    atomic_write_bytes(path, data)
    return {"path": path, "documents": len(docs), "bytes": len(data)}
