"""A small real instruction set with no download: questions and answers from Python's help topics.

`pydoc_data.topics` holds the language reference sections shown by `help()`. Every section (the
topic itself and its `===`/`---` underlined subsections) becomes one conversation:

    system     "You answer questions about the Python language."
    user       'What does the "assert" statement do?'                     (for 'The "assert" statement')
               'What does the Python language reference say about Coroutines?'   (other titles)
    assistant  the section's first prose paragraph (grammar and code blocks, "Added in version"
               notes and the like skipped; whitespace collapsed to single spaces; a closing ':'
               that introduced a grammar block becomes '.')

Sections without prose, and repeats (some topics share their text, e.g. 'if' and 'else'), are
left out. Written sorted by topic as `{"id": "<topic>/<n>", "messages": [...]}` lines to
`DIR/sft.jsonl`: the same bytes on every machine with the same Python version.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator

from .errors import InputError
from .fsutil import atomic_write_bytes

SFT_NAME = "sft.jsonl"
SYSTEM_PROMPT = "You answer questions about the Python language."
_UNDERLINE = re.compile(r"^([*=\-~^])\1+$")
_STATEMENT = re.compile(r'^The "([^"]+)" statement$')
_NOT_PROSE = ("Added in version", "Changed in version", "New in version", "Deprecated", "Note:", "See also",
              "**Source code:**")


def _sections(text: str) -> Iterator[tuple[str, list[str]]]:
    """(title, paragraphs) of a topic and of each of its underlined subsections."""
    title: str | None = None
    paragraphs: list[str] = []
    for block in text.split("\n\n"):
        lines = block.strip("\n").split("\n")
        if len(lines) >= 2 and _UNDERLINE.match(lines[-1]) and len(lines[-1]) >= len(lines[-2].rstrip()):
            if title is not None:
                yield title, paragraphs
            title, paragraphs = lines[-2].strip(), []
            continue
        if block.strip():
            paragraphs.append(block.strip("\n"))
    if title is not None:
        yield title, paragraphs


def _answer(paragraphs: list[str]) -> str | None:
    for paragraph in paragraphs:
        if paragraph[:1].isspace() or paragraph.startswith(_NOT_PROSE):
            continue  # indented: grammar or code
        answer = " ".join(paragraph.split())  # one line, single spaces (the docs put two after a period)
        if len(answer) < 40:
            continue  # a heading-like fragment, not an explanation
        return answer[:-1] + "." if answer.endswith(":") else answer
    return None


def _question(title: str) -> str:
    match = _STATEMENT.match(title)
    if match:
        return f'What does the "{match.group(1)}" statement do?'
    return f"What does the Python language reference say about {title}?"


def demo_conversations() -> Iterator[dict]:
    from pydoc_data.topics import topics

    seen: set[tuple[str, str]] = set()
    for topic in sorted(topics):
        for n, (title, paragraphs) in enumerate(_sections(topics[topic])):
            answer = _answer(paragraphs)
            if answer is None:
                continue
            question = _question(title)
            if (question, answer) in seen:
                continue
            seen.add((question, answer))
            yield {
                "id": f"{topic}/{n}",
                "messages": [
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": question},
                    {"role": "assistant", "content": answer},
                ],
            }


def make_demo_sft(directory: str, overwrite: bool = False) -> dict[str, object]:
    """Write `<directory>/sft.jsonl`; returns its path and size figures."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise InputError(f"{directory}: exists and is not a directory")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, SFT_NAME)
    if os.path.exists(path) and not overwrite:
        raise InputError(f"{path}: exists; refusing to overwrite (pass --overwrite)")
    rows = list(demo_conversations())
    data = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows).encode("utf-8")
    atomic_write_bytes(path, data)
    return {"path": path, "conversations": len(rows), "bytes": len(data)}
