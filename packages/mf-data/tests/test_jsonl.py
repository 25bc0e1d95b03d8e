"""Corpus lines: the orjson fast path and the standard-library path accept and reject the same."""

from __future__ import annotations

import gzip

import pytest

from mf_data import jsonl

LINES = [
    b'{"text": "plain"}\n',
    '{"text": "unicode \u00e9\u4e2d \\ud83d\\ude00"}\n'.encode(),
    b'{"text": "lone \\ud800 surrogate"}\n',
    b'{"text": "nan here", "x": NaN}\n',
    b'{"text": ["a", "b"], "n": 123456789012345678901234567890}\n',
    b'{"text": "dup", "text": "last wins"}\n',
    b'   \n',
    b'{"text": 5}\n',
    b'[1, 2]\n',
    b'{"other": "x"}\n',
    b'{"text": "cut\n',
    b'\xff\xfe{"text": "x"}\n',
]


def _outcomes(lines=LINES):
    out = []
    for line in lines:
        try:
            out.append(("ok", jsonl.parse_line(line, ["text"])))
        except jsonl.LineError as err:
            out.append(("bad", str(err)))
    return out


def test_fast_and_standard_parsers_agree(monkeypatch):
    assert jsonl._fast_loads is not None, "orjson is part of the test extra"
    fast = _outcomes()
    monkeypatch.setattr(jsonl, "_fast_loads", None)
    assert _outcomes() == fast
    kinds = [k for k, _ in fast]
    assert kinds == ["ok", "ok", "bad", "ok", "ok", "ok", "ok", "bad", "bad", "bad", "bad", "bad"]
    # valid JSON, but no tokenizer can encode a lone surrogate: a bad line, not a TypeError later
    assert fast[2][1] == "a string holds a lone surrogate (not encodable as UTF-8)"
    assert fast[6][1] is None and fast[5][1] == {"text": "last wins"}
    assert fast[-1][1] == "not valid UTF-8"


def test_gzip_is_detected_by_content(tmp_path):
    path = tmp_path / "named.jsonl"  # no .gz suffix
    with gzip.open(path, "wb") as f:
        f.write(b'{"text": "a"}\n{"text": "b"}\n')
    stats = {}
    docs = list(jsonl.iter_documents([str(path)], ["text"], strict=False, stats=stats))
    assert docs == [{"text": "a"}, {"text": "b"}] and stats == {"documents": 2, "bad_lines": 0}
    with pytest.raises(jsonl.InputError, match="missing.jsonl: input file not found"):
        list(jsonl.iter_documents([str(tmp_path / "missing.jsonl")], ["text"], strict=False))


def test_bulk_parse_agrees_with_one_line_at_a_time():
    lines = [line.rstrip(b"\n") for line in LINES]  # as read_line_chunks hands them out
    docs, bad = jsonl.parse_lines(lines, ["text"])
    single = _outcomes(lines)
    assert bad == [(i, reason) for i, (kind, reason) in enumerate(single) if kind == "bad"]
    assert [d["text"] for d in docs] == [doc["text"] for kind, doc in single if kind == "ok" and doc is not None]


@pytest.mark.parametrize("packed", ["plain", "gzip"])
@pytest.mark.parametrize("ending", [b"\n", b""])
def test_line_chunks_are_the_lines_in_order_across_block_edges(tmp_path, packed, ending):
    body = b'{"text": "first"}\n\n{"text": "a longer second line"}\n' + b'{"text": "x"}\n' * 9 + b'{"text": "last"}' + ending
    path = tmp_path / "c.jsonl"
    (gzip.open if packed == "gzip" else open)(path, "wb").write(body)
    expected = [line.rstrip(b"\n") for _, line in jsonl.read_lines(str(path))]
    for block in (1, 7, 64, 1 << 20):
        for max_lines in (1, 4, 100):
            chunks = list(jsonl.read_line_chunks(str(path), max_lines, block))
            assert [line for _, lines in chunks for line in lines] == expected, (block, max_lines)
            assert [first for first, _ in chunks] == list(range(1, len(expected) + 1, max_lines))
            assert all(len(lines) == max_lines for _, lines in chunks[:-1])
