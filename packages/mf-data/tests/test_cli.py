"""The `mf-data` tools through their real entry points: main(argv) and the installed command."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import entry_points

import numpy as np
import pytest

from mf_data import IndexedDataset
from mf_data.cli import main


def _run(*argv):
    return subprocess.run([sys.executable, "-m", "mf_data.cli", *argv], capture_output=True, text=True, timeout=120)


def _one_line_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_console_script_is_declared():
    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts.get("mf-data") == "mf_data.cli:main"


def test_demo_corpus_is_deterministic_english(tmp_path, demo_corpus):
    assert main(["make-demo-corpus", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "corpus.jsonl").read_bytes() == demo_corpus.read_bytes()
    docs = [json.loads(line) for line in demo_corpus.read_text().splitlines()]
    assert len(docs) > 50 and all(set(d) == {"id", "text"} and d["text"] for d in docs)
    assert any("statement" in d["text"] for d in docs)
    assert main(["make-demo-corpus", str(tmp_path / "again")]) == 2  # exists: refused


def test_preprocess_matches_direct_encoding(tmp_path, demo_corpus, spm_model):
    import sentencepiece

    out1, out2 = tmp_path / "one", tmp_path / "two"
    base = ["preprocess", "--input", str(demo_corpus), "--tokenizer-model", str(spm_model), "--append-eod", "--no-progress"]
    assert main([*base, "--output-prefix", str(out1), "--workers", "1"]) == 0
    assert main([*base, "--output-prefix", str(out2), "--workers", "2", "--chunk-lines", "16"]) == 0
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"one_text_document{ext}").read_bytes() == (tmp_path / f"two_text_document{ext}").read_bytes()
    ds = IndexedDataset(str(tmp_path / "one_text_document"))
    sp = sentencepiece.SentencePieceProcessor(model_file=str(spm_model))
    texts = [json.loads(line)["text"] for line in demo_corpus.read_text().splitlines()]
    assert ds.dtype is np.uint16 and ds.num_documents == len(texts)
    for i in (0, 7, len(texts) - 1):
        assert ds[i].tolist() == sp.encode(texts[i]) + [sp.eos_id()]


def test_preprocess_bad_lines_gzip_and_several_keys(tmp_path, spm_model, capsys):
    lines = [
        json.dumps({"text": "The assert statement", "title": "assert"}),
        "{not json",
        json.dumps({"title": "no text"}),
        "",
        json.dumps({"text": ["Two sentences.", "In one document."], "title": "list"}),
        json.dumps({"text": 5, "title": "number"}),
        json.dumps({"text": "", "title": "empty"}),
    ]
    path = tmp_path / "c.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")
    out = tmp_path / "o"
    code = main(["preprocess", "--input", str(path), "--json-keys", "text", "title", "--tokenizer-model", str(spm_model),
                 "--output-prefix", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 0
    assert "skipped 3 bad line(s)" in err and ":2: invalid JSON" in err and ":3: missing key 'text'" in err and ":6: key 'text' holds int" in err
    text, title = IndexedDataset(str(out) + "_text_document"), IndexedDataset(str(out) + "_title_document")
    assert text.num_documents == title.num_documents == 3  # aligned line for line
    assert np.diff(text.document_indices).tolist() == [1, 2, 0]  # a list is one sequence per entry; "" is empty
    assert "tokens/s" in err

    # --strict stops at the first bad line: exit 2, one line, nothing written, old files untouched.
    before = (tmp_path / "o_text_document.bin").read_bytes()
    code = main(["preprocess", "--input", str(path), "--tokenizer-model", str(spm_model), "--output-prefix", str(out),
                 "--strict", "--overwrite", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and _one_line_error(err).endswith(":2: invalid JSON (Expecting property name enclosed in double quotes) (--strict)")
    assert (tmp_path / "o_text_document.bin").read_bytes() == before
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["preprocess", "--input", "missing.jsonl", "--tokenizer-model", "{spm}", "--output-prefix", "{tmp}/x"], "missing.jsonl: input file not found"),
        (["preprocess", "--input", "{corpus}", "--tokenizer-model", "{tmp}/none.model", "--output-prefix", "{tmp}/x"], "none.model: tokenizer model not found"),
        (["preprocess", "--input", "{corpus}", "--tokenizer-model", "{corpus}", "--output-prefix", "{tmp}/x"], "not a sentencepiece model"),
        (["preprocess", "--input", "{corpus}", "--tokenizer-model", "{spm}", "--output-prefix", "{tmp}/x", "--workers", "0"], "must be at least 1"),
        (["train-tokenizer", "--input", "{tmp}/tiny.jsonl", "--vocab-size", "5000", "--output", "{tmp}/t.model"], "Vocabulary size too high"),
        (["inspect", "{tmp}/absent"], "absent.idx: not found"),
        (["inspect", "{tmp}/broken"], "bad magic"),
        (["frobnicate"], "invalid choice"),
        (["preprocess"], "required"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, demo_corpus, spm_model, capsys, argv, message):
    (tmp_path / "tiny.jsonl").write_text(json.dumps({"text": "just a few words here"}) + "\n")
    (tmp_path / "broken.idx").write_bytes(b"garbage" * 10)
    (tmp_path / "broken.bin").write_bytes(b"")
    argv = [a.format(spm=spm_model, tmp=tmp_path, corpus=demo_corpus) for a in argv]
    assert main(argv) == 2
    assert message in _one_line_error(capsys.readouterr().err)
    assert not (tmp_path / "t.model").exists() and not (tmp_path / "x_text_document.bin").exists()


def test_bad_input_in_a_real_process_has_no_traceback(tmp_path):
    (tmp_path / "broken.idx").write_bytes(b"MMIDIDX\x00\x00" + bytes(30))
    (tmp_path / "broken.bin").write_bytes(b"")
    result = _run("inspect", str(tmp_path / "broken"))
    assert result.returncode == 2 and result.stdout == ""
    assert _one_line_error(result.stderr) == f"mf-data: error: {tmp_path / 'broken.idx'}: unsupported index version 0 (only 1 is known)"


def test_inspect_reports_the_megatron_fixture(megatron_fixtures, capsys):
    assert main(["inspect", str(megatron_fixtures / "a_u16"), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    ds = IndexedDataset(str(megatron_fixtures / "a_u16"))
    assert stats["documents"] == 300 and stats["dtype"] == "uint16" and stats["tokens"] == ds.num_tokens
    lengths = ds.sequence_lengths
    assert stats["document_tokens"]["max"] == lengths.max() and stats["document_tokens"]["p50"] == float(np.percentile(lengths, 50))
    assert main(["inspect", str(megatron_fixtures / "b_i32")]) == 0
    table = capsys.readouterr().out
    assert "int32" in table and "documents   200" in table and "p99" in table


def test_train_tokenizer_and_installed_command(tmp_path, demo_corpus):
    exe = shutil.which("mf-data", path=os.path.dirname(sys.executable))
    assert exe, "the mf-data console script is not installed next to this python"
    result = subprocess.run([exe, "train-tokenizer", "--input", str(demo_corpus), "--vocab-size", "300", "--model-type", "bpe",
                             "--output", str(tmp_path / "bpe.model")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "bpe.model"))
    assert sp.get_piece_size() == 300 and sp.decode(sp.encode("The assert statement")) == "The assert statement"
