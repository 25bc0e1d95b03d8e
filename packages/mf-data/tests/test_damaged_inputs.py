"""Damaged corpora and bad arguments through `mf-data preprocess` and `preprocess-sft` (the real
entry point, `main(argv)`, and a few in a real process): a bad line is counted (fatal with
--strict), a damaged file or a bad argument is one line with exit 2, never a traceback, and
existing outputs stay byte for byte as they were, with no temporary file left behind.

The table is the red-team list of issue 17: a valid-JSON line holding a lone surrogate, a gzip
input cut mid-stream or corrupt, a line nested deeper than the JSON parser goes, an output prefix
that cannot be written, `--json-keys` naming a path, and worker counts that would fork without
bound.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mf_data import IndexedDataset, TokenRange, token_range
from mf_data.cli import main

GOOD_TEXT = [json.dumps({"text": f"The assert statement number {i} is here."}) for i in range(40)]
GOOD_SFT = [json.dumps({"prompt": f"What is {i} plus one?", "response": f"It is {i + 1}."}) for i in range(40)]
SURROGATE_TEXT = '{"text": "lone \\ud800 surrogate"}'
SURROGATE_SFT = '{"prompt": "lone \\ud800 surrogate", "response": "ok"}'
DEEP = "[" * 100_000 + "]" * 100_000


def _plain(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def _gzip(path: Path, lines: list[str]) -> Path:
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")
    return path


def _truncated_gzip(path: Path, lines: list[str]) -> Path:
    _gzip(path, lines * 20)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    return path


def _corrupt_gzip(path: Path, lines: list[str]) -> Path:
    _gzip(path, lines * 20)
    data = bytearray(path.read_bytes())
    for i in range(40, 80):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    return path


def command(kind: str, inp: Path, prefix: Path, spm: Path, *extra: str) -> list[str]:
    if kind == "text":
        return ["preprocess", "--input", str(inp), "--tokenizer-model", str(spm), "--output-prefix", str(prefix),
                "--no-progress", *extra]
    return ["preprocess-sft", "--input", str(inp), "--tokenizer", str(spm), "--output-prefix", str(prefix),
            "--no-progress", *extra]


def outputs(kind: str, prefix: Path) -> list[Path]:
    base = f"{prefix}_text_document" if kind == "text" else f"{prefix}_sft_document"
    names = [base] if kind == "text" else [base, base + "_loss_mask"]
    return [Path(n + ext) for n in names for ext in (".bin", ".idx")]


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("mf-data: error: "), lines[0]
    return lines[0]


# (id, corpus writer, line-or-lines added to the good corpus, extra arguments, outcome, needle)
# outcome "bad-line": exit 0 and the line counted; "error": exit 2, one line, outputs untouched.
CASES = [
    ("lone-surrogate", _plain, "surrogate", [], "bad-line", "a string holds a lone surrogate"),
    ("lone-surrogate-strict", _plain, "surrogate", ["--strict"], "error", ":41: a string holds a lone surrogate"),
    ("deeply-nested-line", _plain, DEEP, [], "bad-line", "JSON nested too deeply"),
    ("deeply-nested-line-strict", _plain, DEEP, ["--strict"], "error", ":41: JSON nested too deeply (--strict)"),
    ("gzip-truncated-mid-stream", _truncated_gzip, None, [], "error", "the gzip stream ends before its end marker"),
    ("gzip-corrupt", _corrupt_gzip, None, [], "error", "corrupt gzip data"),
    ("unwritable-output-prefix", _plain, None, ["--output-prefix", "{tmp}/" + "x" * 300], "error",
     "cannot write the output (File name too long)"),
    ("output-prefix-in-a-file", _plain, None, ["--output-prefix", "{corpus}/x"], "error", "output directory does not exist"),
]
TEXT_ONLY = [
    ("json-keys-path", _plain, None, ["--json-keys", "../../x"], "error", "--json-keys: '../../x' cannot be part of a file name"),
    ("json-keys-absolute", _plain, None, ["--json-keys", "text", "/etc/x"], "error", "cannot be part of a file name"),
]


@pytest.mark.parametrize("kind", ["text", "sft"])
@pytest.mark.parametrize("case", CASES + TEXT_ONLY, ids=[c[0] for c in CASES + TEXT_ONLY])
def test_damaged_input(tmp_path, spm_model, capsys, kind, case):
    name, writer, extra_line, extra, outcome, needle = case
    if kind == "sft" and case in TEXT_ONLY:
        pytest.skip("preprocess-sft names its outputs itself")
    good = GOOD_TEXT if kind == "text" else GOOD_SFT
    prefix = tmp_path / "out"
    # existing outputs from a good run: a failing run must leave them as they are
    assert main(command(kind, _plain(tmp_path / "good.jsonl", good), prefix, spm_model)) == 0
    before = {p: p.read_bytes() for p in outputs(kind, prefix)}
    capsys.readouterr()
    if extra_line == "surrogate":
        extra_line = SURROGATE_TEXT if kind == "text" else SURROGATE_SFT
    corpus = writer(tmp_path / "corpus.jsonl", good + ([extra_line] if extra_line else []))
    extra = [a.format(tmp=tmp_path, corpus=corpus) for a in extra]
    argv = command(kind, corpus, prefix, spm_model, "--overwrite")
    if "--output-prefix" in extra:
        at = argv.index("--output-prefix")
        argv[at + 1] = extra[extra.index("--output-prefix") + 1]
        extra = [a for i, a in enumerate(extra) if a != "--output-prefix" and (i == 0 or extra[i - 1] != "--output-prefix")]
    code = main([*argv, *extra])
    err = capsys.readouterr().err
    if outcome == "bad-line":
        assert code == 0, err
        assert "skipped 1 bad line(s)" in err and needle in err, err
        docs = IndexedDataset(str(outputs(kind, prefix)[0])[:-4])
        assert docs.num_documents == len(good)
    else:
        assert code == 2, err
        assert needle in one_line(err)
        assert {p: p.read_bytes() for p in outputs(kind, prefix)} == before
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]


@pytest.mark.parametrize("kind", ["text", "sft"])
@pytest.mark.parametrize("workers", ["1000000", "1000000000"])
def test_worker_count_is_clamped_to_the_cpus(tmp_path, spm_model, capsys, kind, workers):
    good = GOOD_TEXT if kind == "text" else GOOD_SFT
    corpus = _plain(tmp_path / "c.jsonl", good)
    assert main(command(kind, corpus, tmp_path / "one", spm_model, "--workers", "1")) == 0
    capsys.readouterr()
    assert main(command(kind, corpus, tmp_path / "many", spm_model, "--workers", workers)) == 0
    err = capsys.readouterr().err
    cpus = len(os.sched_getaffinity(0))
    assert f"--workers {workers}: this machine gives {cpus} CPU(s) to this process; using {cpus}" in err
    assert f"{cpus} worker(s)" in err
    for one, many in zip(outputs(kind, tmp_path / "one"), outputs(kind, tmp_path / "many")):
        assert one.read_bytes() == many.read_bytes()


@pytest.mark.parametrize("case_id", ["gzip-truncated-mid-stream", "deeply-nested-line-strict"])
def test_in_a_real_process(tmp_path, spm_model, case_id):
    _, writer, extra_line, extra, _, needle = next(c for c in CASES if c[0] == case_id)
    corpus = writer(tmp_path / "c.jsonl", GOOD_TEXT + ([extra_line] if extra_line else []))
    r = subprocess.run([sys.executable, "-m", "mf_data.cli", *command("text", corpus, tmp_path / "o", spm_model), *extra],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and needle in one_line(r.stderr)
    assert not list(tmp_path.glob("o_*"))


# ---- the token range a trainer checks against its vocabulary --------------------------------
def test_token_range_is_recorded_at_build_and_read_cheaply(tmp_path, spm_model, monkeypatch):
    corpus = _plain(tmp_path / "c.jsonl", GOOD_TEXT)
    assert main(command("text", corpus, tmp_path / "o", spm_model, "--append-eod")) == 0
    prefix = str(tmp_path / "o_text_document")
    stats = json.loads(Path(prefix + ".stats.json").read_text())
    ds = IndexedDataset(prefix)
    tokens = np.concatenate(ds[0:len(ds)])
    expected = TokenRange(int(tokens.min()), int(tokens.max()))
    assert (stats["min_token"], stats["max_token"], stats["num_tokens"]) == (*expected, tokens.size)
    # read from the stats file: the .bin is not scanned again
    monkeypatch.setattr(IndexedDataset, "_read", lambda *a: pytest.fail("the .bin was scanned"))
    assert token_range(prefix) == expected


def test_token_range_of_a_megatron_pair_is_computed_once_and_cached(megatron_fixtures, tmp_path, monkeypatch):
    import shutil

    for ext in (".bin", ".idx"):
        shutil.copy(megatron_fixtures / f"b_i32{ext}", tmp_path / f"b{ext}")
    prefix = str(tmp_path / "b")
    ds = IndexedDataset(prefix)
    tokens = np.concatenate(ds[0:len(ds)])
    assert not Path(prefix + ".stats.json").exists()  # Megatron writes no such file
    assert token_range(prefix) == (int(tokens.min()), int(tokens.max()))
    assert Path(prefix + ".stats.json").exists()
    monkeypatch.setattr(IndexedDataset, "_read", lambda *a: pytest.fail("the .bin was scanned twice"))
    assert token_range(prefix) == (int(tokens.min()), int(tokens.max()))


def test_token_range_without_cache_writes_nothing(megatron_fixtures, tmp_path):
    import shutil

    for ext in (".bin", ".idx"):
        shutil.copy(megatron_fixtures / f"b_i32{ext}", tmp_path / f"b{ext}")
    prefix = str(tmp_path / "b")
    tokens = np.concatenate(IndexedDataset(prefix)[0:len(IndexedDataset(prefix))])
    # what a dry run asks: the range, with no stats file written beside the data
    assert token_range(prefix, cache=False) == (int(tokens.min()), int(tokens.max()))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.bin", "b.idx"]


def test_token_range_follows_the_files_and_survives_a_read_only_directory(tmp_path, write_dataset, monkeypatch):
    prefix = write_dataset([[5, 6, 7], [300, 1]])
    assert token_range(prefix) == (1, 300)
    # the pair rewritten (say by another tool): the stale stats no longer match its files
    stats = Path(prefix + ".stats.json").read_text()
    data = bytearray(Path(prefix + ".bin").read_bytes())
    data[0:2] = np.uint16(9000).tobytes()
    Path(prefix + ".bin").write_bytes(bytes(data))
    os.utime(prefix + ".bin", ns=(1, 1))
    assert token_range(prefix) == (1, 9000)
    # where nothing can be written, the range is still computed (and simply not cached)
    Path(prefix + ".stats.json").write_text(stats)
    import mf_data.indexed_dataset as ix

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(ix, "atomic_write_bytes", read_only)
    assert token_range(prefix) == (1, 9000)
    assert write_dataset([[]], name="empty") and token_range(str(tmp_path / "empty")) is None
