"""`mf-data preprocess-sft` and `make-demo-sft` through main(argv): outputs, summary, bad lines,
exit codes, workers, and the file -> loader round trip."""

from __future__ import annotations

import gzip
import json
import os
import unicodedata

import numpy as np
import pytest

from mf_data import BlendedMegatronDatasetDataLoader, SFTIndexedDataset, load_tokenizer
from mf_data.cli import main


def _one_line_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


@pytest.fixture(scope="session")
def demo_sft(tmp_path_factory):
    directory = tmp_path_factory.mktemp("demo-sft")
    assert main(["make-demo-sft", str(directory)]) == 0
    return directory / "sft.jsonl"


def test_make_demo_sft_is_deterministic_and_real(tmp_path, demo_sft, capsys):
    assert main(["make-demo-sft", str(tmp_path)]) == 0
    assert (tmp_path / "sft.jsonl").read_bytes() == demo_sft.read_bytes()
    rows = [json.loads(line) for line in demo_sft.read_text().splitlines()]
    assert len(rows) > 100 and len({r["id"] for r in rows}) == len(rows)
    by_id = {r["id"]: r["messages"] for r in rows}
    system, user, assistant = by_id["assert/0"]
    assert system["role"] == "system" and user == {"role": "user", "content": 'What does the "assert" statement do?'}
    assert assistant["content"].startswith("Assert statements are a convenient way to insert debugging assertions")
    assert all(m[2]["content"] and not m[2]["content"].startswith(" ") for m in by_id.values())
    capsys.readouterr()
    assert main(["make-demo-sft", str(tmp_path)]) == 2  # exists: refused
    assert "exists; refusing to overwrite" in _one_line_error(capsys.readouterr().err)


def test_preprocess_sft_round_trip_to_loader_batches(tmp_path, demo_sft, spm_model, capsys):
    out = tmp_path / "demo"
    assert main(["preprocess-sft", "--input", str(demo_sft), "--tokenizer", str(spm_model), "--output-prefix", str(out),
                 "--no-progress"]) == 0
    err = capsys.readouterr().err
    rows = [json.loads(line) for line in demo_sft.read_text().splitlines()]
    assert f"{len(rows)} samples" in err and "template: builtin" in err and "0 bad line(s)" in err
    data = SFTIndexedDataset(str(out) + "_sft_document")
    tok = load_tokenizer(str(spm_model))
    assert len(data) == len(rows) and data.dtype is np.uint16
    for k in (0, 50, len(rows) - 1):
        ids, bits = data.read(k)
        assert tok.decode(ids[bits == 1].tolist()) == unicodedata.normalize("NFKC", rows[k]["messages"][2]["content"])
        assert ids[-1] == tok.eod and bits[-1] == 1

    assert main(["inspect", str(out) + "_sft_document", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["documents"] == len(rows) and stats["response_tokens"] == int(sum(data.read(k)[1].sum() for k in range(len(data))))

    loader = BlendedMegatronDatasetDataLoader(
        datasets_type="SFTDataset", sizes=[40, 0, 0], micro_batch_size=4, num_parallel_workers=1,
        config={"seq_length": 256, "split": "1", "data_path": [str(out) + "_sft_document"], "seed": 5,
                "path_to_cache": str(tmp_path / "cache")},
    )
    # sentencepiece's default normaliser is NFKC (e.g. "…" -> "..."): compare in that form.
    answers = {unicodedata.normalize("NFKC", r["messages"][2]["content"]) for r in rows}
    checked = 0
    for batch in loader:
        for b in range(4):
            # The trained labels of each packed sample decode to exactly one reply (+ EOS).
            starts = np.flatnonzero(batch["position_ids"][b] == 0).tolist() + [256]
            for lo, hi in zip(starts, starts[1:]):
                trained = batch["labels"][b, lo:hi][batch["loss_mask"][b, lo:hi] == 1].tolist()
                if not trained:
                    continue  # the padding segment
                if hi - lo == 256:  # truncated to seq_length: the reply keeps its start, loses its EOS
                    assert any(a.startswith(tok.decode(trained)) for a in answers)
                else:
                    assert trained[-1] == tok.eod and tok.decode(trained[:-1]) in answers
                checked += 1
    assert checked >= 40 and loader.state_dict() == {"consumed_samples": len(loader.dataset)}


def test_bad_lines_gzip_formats_and_strict(tmp_path, spm_model, capsys):
    lines = [
        json.dumps({"prompt": "What does pass do?", "response": "Nothing.", "system": "Be brief."}),
        "{not json",
        json.dumps({"messages": [{"role": "user", "content": "hi"}]}),
        "",
        json.dumps({"question": "q", "answer": "a"}),
        json.dumps({"messages": [{"role": "user", "content": "Name a loop."}, {"role": "assistant", "content": "for"},
                                 {"role": "user", "content": "Another?"}, {"role": "assistant", "content": "while"}]}),
    ]
    path = tmp_path / "chat.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")
    out = tmp_path / "o"
    assert main(["preprocess-sft", "--input", str(path), "--tokenizer", str(spm_model), "--output-prefix", str(out),
                 "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "2 samples" in err and "skipped 3 bad line(s)" in err
    assert ":2: invalid JSON" in err and ":3: the conversation must end with an assistant message" in err
    assert ":5: neither 'messages' nor 'prompt'/'response'" in err
    data = SFTIndexedDataset(str(out) + "_sft_document")
    tok = load_tokenizer(str(spm_model))
    ids, bits = data.read(1)
    assert tok.decode(ids[bits == 1].tolist()) == "for while"
    assert "Be brief" in tok.decode(data.read(0)[0].tolist())

    # --strict: the first bad line is fatal; one line, exit 2, nothing written, old files untouched.
    before = (tmp_path / "o_sft_document.bin").read_bytes()
    code = main(["preprocess-sft", "--input", str(path), "--tokenizer", str(spm_model), "--output-prefix", str(out),
                 "--strict", "--overwrite", "--no-progress"])
    assert code == 2 and _one_line_error(capsys.readouterr().err).endswith(":2: invalid JSON (Expecting property name "
                                                                            "enclosed in double quotes) (--strict)")
    assert (tmp_path / "o_sft_document.bin").read_bytes() == before
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]

    # Configurable keys turn line 5 into a sample.
    assert main(["preprocess-sft", "--input", str(path), "--tokenizer", str(spm_model), "--output-prefix",
                 str(tmp_path / "k"), "--prompt-key", "question", "--response-key", "answer", "--no-progress"]) == 0
    assert "skipped 3 bad line(s)" in capsys.readouterr().err  # line 1 now lacks 'question'
    assert len(SFTIndexedDataset(str(tmp_path / "k_sft_document"))) == 2


def test_seq_length_truncates_or_drops_and_workers_agree(tmp_path, demo_sft, spm_model, capsys):
    base = ["preprocess-sft", "--input", str(demo_sft), "--tokenizer", str(spm_model), "--seq-length", "128",
            "--no-progress"]
    assert main([*base, "--output-prefix", str(tmp_path / "one")]) == 0
    err = capsys.readouterr().err
    truncated = int(err.split("seq_length 128: truncated ")[1].split()[0])
    assert truncated > 0
    assert main([*base, "--output-prefix", str(tmp_path / "two"), "--workers", "2", "--chunk-lines", "16"]) == 0
    capsys.readouterr()
    for suffix in ("_sft_document", "_sft_document_loss_mask"):
        for ext in (".bin", ".idx"):
            assert (tmp_path / f"one{suffix}{ext}").read_bytes() == (tmp_path / f"two{suffix}{ext}").read_bytes()
    one = SFTIndexedDataset(str(tmp_path / "one_sft_document"))
    assert one.sequence_lengths.max() == 128
    assert main([*base, "--output-prefix", str(tmp_path / "drop"), "--drop-long"]) == 0
    err = capsys.readouterr().err
    dropped = int(err.split("seq_length 128: dropped ")[1].split()[0])
    assert dropped >= truncated and len(SFTIndexedDataset(str(tmp_path / "drop_sft_document"))) == len(one) - dropped


def test_hf_tokenizer_directory_through_the_cli(tmp_path, hf_tokenizer_dirs, capsys):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"prompt": "What does the pass statement do?", "response": "Nothing."}) + "\n")
    directory = hf_tokenizer_dirs["chatml"]
    assert main(["preprocess-sft", "--input", str(path), "--tokenizer", str(directory), "--output-prefix",
                 str(tmp_path / "h"), "--no-progress"]) == 0
    assert f"template: {directory / 'tokenizer_config.json'}" in capsys.readouterr().err
    ids, bits = SFTIndexedDataset(str(tmp_path / "h_sft_document")).read(0)
    tok = load_tokenizer(str(directory))
    assert tok.decode(ids[bits == 1].tolist()) == "Nothing.<|im_end|>\n"
    assert tok.decode(ids.tolist()).startswith("<|im_start|>user\nWhat does the pass statement do?<|im_end|>\n")


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--tokenizer", "{tmp}/none.model"], "none.model: tokenizer not found"),
        (["--tokenizer", "{tmp}"], "no tokenizer.json"),
        (["--tokenizer", "{corpus}"], "not a sentencepiece model"),
        (["--tokenizer", "{spm}", "--drop-long"], "--drop-long needs --seq-length"),
        (["--tokenizer", "{spm}", "--seq-length", "1"], "--seq-length must be at least 2"),
        (["--tokenizer", "{chatml}", "--add-bos"], "built-in template only"),
        (["--tokenizer", "{spm}", "--prompt-key", "messages"], "must differ"),
        (["--tokenizer", "{spm}", "--input", "{tmp}/missing.jsonl"], "missing.jsonl: input file not found"),
        (["--tokenizer", "{spm}", "--input", "{tmp}/bad.jsonl"], "no usable samples"),
        (["--tokenizer", "{spm}", "--workers", "0"], "must be at least 1"),
        ([], "required: --tokenizer"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, demo_sft, spm_model, hf_tokenizer_dirs, capsys, extra, message):
    (tmp_path / "bad.jsonl").write_text("[1]\n")
    argv = ["preprocess-sft", "--output-prefix", str(tmp_path / "x"), "--no-progress"]
    if "--input" not in extra:
        argv += ["--input", str(demo_sft)]
    argv += [a.format(tmp=tmp_path, spm=spm_model, corpus=demo_sft, chatml=hf_tokenizer_dirs["chatml"]) for a in extra]
    assert main(argv) == 2
    assert message in _one_line_error(capsys.readouterr().err)
    assert not (tmp_path / "x_sft_document.bin").exists() and not (tmp_path / "x_sft_document_loss_mask.bin").exists()


def test_existing_outputs_are_refused(tmp_path, demo_sft, spm_model, capsys):
    (tmp_path / "x_sft_document_loss_mask.idx").write_bytes(b"keep")
    argv = ["preprocess-sft", "--input", str(demo_sft), "--tokenizer", str(spm_model), "--output-prefix",
            str(tmp_path / "x"), "--no-progress"]
    assert main(argv) == 2
    assert "x_sft_document_loss_mask.idx: exists; refusing to overwrite" in _one_line_error(capsys.readouterr().err)
    assert (tmp_path / "x_sft_document_loss_mask.idx").read_bytes() == b"keep"
