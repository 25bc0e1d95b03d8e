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


def _outcomes():
    out = []
    for line in LINES:
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
