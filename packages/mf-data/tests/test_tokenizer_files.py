"""tokenizer_files: a tokenizer as the files transformers reads (what a checkpoint carries).

Reference: transformers' AutoTokenizer, loading the files we wrote, encodes ordinary text to the
same ids as mf-data's own tokenizer; the directory of those files loads back in mf-data too.
"""

from __future__ import annotations

import json

import pytest

from mf_data import InputError, SentencePieceTokenizer, load_tokenizer, tokenizer_files

TEXTS = ["The quick brown fox jumps over the lazy dog.", "  two  spaces, then\ta tab", "numbers 12345 and ümlauts"]


def _write(files: dict[str, bytes], directory):
    directory.mkdir()
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return directory


def test_a_sentencepiece_model_becomes_tokenizer_model_and_config(spm_model, tmp_path):
    files = tokenizer_files(spm_model)
    assert set(files) == {"tokenizer.model", "tokenizer_config.json"}
    assert files["tokenizer.model"] == spm_model.read_bytes()
    config = json.loads(files["tokenizer_config.json"])
    # mf encodes without BOS/EOS: the config says so, so transformers encodes the same
    assert config["add_bos_token"] is False and config["add_eos_token"] is False
    ours = SentencePieceTokenizer(str(spm_model))
    assert config["eos_token"] == ours._sp.IdToPiece(ours.eod)

    directory = _write(files, tmp_path / "tokenizer")
    again = load_tokenizer(str(directory))            # a directory holding only tokenizer.model (+ config)
    assert isinstance(again, SentencePieceTokenizer)
    assert again.encode(TEXTS) == ours.encode(TEXTS)
    assert tokenizer_files(directory) == files        # described again as it is


def test_transformers_encodes_the_sentencepiece_export_as_mf_does(spm_model, tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers (mf-data's test extra) is the reference")
    pytest.importorskip("google.protobuf", reason="transformers converts tokenizer.model with protobuf")
    directory = _write(tokenizer_files(spm_model), tmp_path / "tokenizer")
    hf = transformers.AutoTokenizer.from_pretrained(str(directory))
    ours = SentencePieceTokenizer(str(spm_model))
    for text in TEXTS:
        assert hf(text, add_special_tokens=True)["input_ids"] == ours.encode([text])[0], text
    assert hf.eos_token_id == ours.eod


def test_an_hf_tokenizer_directory_is_carried_as_it_is(hf_tokenizer_dirs):
    directory = hf_tokenizer_dirs["chatml"]
    files = tokenizer_files(directory)
    assert set(files) == {"tokenizer.json", "tokenizer_config.json"}
    assert files["tokenizer.json"] == (directory / "tokenizer.json").read_bytes()


@pytest.mark.parametrize("make", [
    lambda p: p / "missing.model",
    lambda p: (p / "garbage.model").write_bytes(b"not a model") and p / "garbage.model",
])
def test_what_mf_data_cannot_load_is_one_line(tmp_path, make):
    with pytest.raises(InputError) as info:
        tokenizer_files(make(tmp_path))
    assert "\n" not in str(info.value)
