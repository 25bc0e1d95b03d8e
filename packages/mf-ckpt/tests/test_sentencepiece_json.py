"""The tokenizer.json an HF export writes for a sentencepiece tokenizer, read by the `tokenizers`
library alone (what transformers' PreTrainedTokenizerFast runs), against sentencepiece itself:
the same ids and the same decoded text for ordinary text, unicode, digits, leading spaces and
newlines, for every kind of model sentencepiece trains that has a Hugging Face equivalent.
(tests-integration/hf_interop runs the same strings through several transformers versions.)"""

from __future__ import annotations

import io
import json
import sys

import pytest

from mf_ckpt import CheckpointError
from mf_ckpt.cli import main
from mf_ckpt.tokenizer_files import hf_export_files

spm = pytest.importorskip("sentencepiece", reason="sentencepiece (mf-ckpt's test extra) is the reference")
tokenizers = pytest.importorskip("tokenizers", reason="tokenizers (mf-ckpt's hf-tokenizer extra) reads the export")

TEXTS = [
    "The for statement", "Classes provide a means of bundling data and functionality together.",
    "ünïcödé, naïve café, 日本語 and 🙂", "e\u0301 (a decomposed accent)", "Ｆｕｌｌｗｉｄｔｈ ①②",
    "digits 12345, 0.5 and 3.14159", "  two leading spaces", "   ", "", "\tTab first", "trailing spaces   ",
    "\nleading newline", "a\nb\n\nc", "def f(x):\n    return x ** 2\n", "crlf\r\nline\r\n", "x  \t  y",
]


def _train(**options) -> bytes:
    from pydoc_data.topics import topics

    lines = [line for text in list(topics.values())[:40] for line in text.splitlines() if line.strip()]
    model = io.BytesIO()
    spm.SentencePieceTrainer.Train(sentence_iterator=iter(lines), model_writer=model, minloglevel=2, **options)
    return model.getvalue()


MODELS = {
    "unigram": dict(vocab_size=300),
    "unigram-byte-fallback": dict(vocab_size=500, byte_fallback=True),
    "bpe-byte-fallback": dict(vocab_size=500, model_type="bpe", byte_fallback=True),
    "bpe-split-digits-nfkc-cf": dict(vocab_size=400, model_type="bpe", split_digits=True,
                                     normalization_rule_name="nfkc_cf"),
    "char": dict(vocab_size=100, model_type="char", character_coverage=0.995),
    "user-symbols-identity-no-prefix": dict(vocab_size=300, user_defined_symbols=["<sep>", "foo"],
                                            control_symbols=["<ctl>"], pad_id=3, normalization_rule_name="identity",
                                            add_dummy_prefix=False, remove_extra_whitespaces=False),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def exported(request):
    model = _train(**MODELS[request.param])
    files = hf_export_files({"tokenizer.model": model}, {"max_position_embeddings": 64}, "ckpt")
    return request.param, model, files


def test_tokenizer_json_encodes_and_decodes_as_sentencepiece(exported):
    _, model, files = exported
    sp = spm.SentencePieceProcessor(model_proto=model)
    tok = tokenizers.Tokenizer.from_str(files["tokenizer.json"].decode("utf-8"))
    for text in TEXTS:
        ids = sp.Encode(text)
        assert tok.encode(text).ids == ids, text
        assert tok.decode(ids, skip_special_tokens=False) == sp.Decode(ids), text
    # the unknown piece decodes to sentencepiece's surface, a control piece to nothing
    ids = [sp.unk_id(), sp.bos_id(), *sp.Encode("The end"), sp.eos_id()]
    assert tok.decode(ids, skip_special_tokens=False) == sp.Decode(ids)


def test_tokenizer_config_names_a_class_every_transformers_has(exported):
    name, model, files = exported
    sp = spm.SentencePieceProcessor(model_proto=model)
    config = json.loads(files["tokenizer_config.json"])
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["add_bos_token"] is False and config["add_eos_token"] is False and config["legacy"] is True
    assert config["add_prefix_space"] is ("no-prefix" not in name) and config["model_max_length"] == 64
    assert config["eos_token"] == sp.IdToPiece(sp.eos_id()) and config["unk_token"] == sp.IdToPiece(sp.unk_id())
    assert files["tokenizer.model"] == model     # kept for the tools that read sentencepiece itself


def test_the_carried_config_keeps_its_other_keys():
    carried = {"tokenizer_class": "TokenizersBackend", "model_max_length": 32, "chat_template": "{{ x }}",
               "add_bos_token": True}
    files = hf_export_files({"tokenizer.model": _train(vocab_size=200),
                             "tokenizer_config.json": json.dumps(carried).encode()}, {"max_position_embeddings": 64},
                            "ckpt")
    config = json.loads(files["tokenizer_config.json"])
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and config["chat_template"] == "{{ x }}"
    assert config["model_max_length"] == 32 and config["add_bos_token"] is False   # mf encodes without BOS


@pytest.mark.parametrize("name, make, needle", [
    ("word-model", lambda: _train(vocab_size=300, model_type="word"),
     "sentencepiece word model has no Hugging Face tokenizer that encodes the same"),
    ("not-a-model", lambda: b"\x00garbage\xff" * 10, "not a sentencepiece model"),
    ("empty-file", lambda: b"", "not a sentencepiece model"),
])
def test_a_tokenizer_that_cannot_be_exported_is_one_line(name, make, needle):
    with pytest.raises(CheckpointError) as info:
        hf_export_files({"tokenizer.model": make()}, {}, "ckpt")
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_without_the_extra_the_export_says_which_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)      # import tokenizers -> ImportError
    with pytest.raises(CheckpointError, match=r"pip install 'mf-ckpt\[hf-tokenizer\]'"):
        hf_export_files({"tokenizer.model": b"x"}, {}, "ckpt")


def test_convert_refuses_before_writing_anything(trained_word, tmp_path, capsys):
    assert main(["convert", "--from", "mf", "--to", "hf", str(trained_word), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "word model" in err and "Traceback" not in err
    assert not (tmp_path / "hf").exists()


@pytest.fixture
def trained_word(hf_fixtures, tmp_path):
    import mf_ckpt

    config, state = mf_ckpt.load_hf_state(hf_fixtures / "llama")
    mf_ckpt.save(str(tmp_path / "ck"), 1, state, common={"hf_config": config},
                 assets=mf_ckpt.tokenizer_assets({"tokenizer.model": _train(vocab_size=300, model_type="word")}))
    return tmp_path / "ck"
