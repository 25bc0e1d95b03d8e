"""The train_dataset mapping onto mf-data, and the demo corpus built through mf-data's API."""

from __future__ import annotations

import pytest

import mf_data
from mf_trainer.demo_data import check_eod, ensure_demo_corpus
from mf_trainer.errors import TrainerConfigError
from mf_trainer.runtime import setup_context


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    cache = tmp_path_factory.mktemp("demo")
    extra = {"config": {"data_path": ["1", str(cache / "pydoc_text_document")], "eod": 2},
             "demo_corpus": {"vocab_size": 300}}
    ensure_demo_corpus(extra, str(cache / "spm.model"), model_vocab=512)
    return cache, extra


def test_demo_corpus_is_built_through_mf_data_and_reused(demo, caplog):
    cache, extra = demo
    dataset = mf_data.IndexedDataset(str(cache / "pydoc_text_document"))
    tokenizer = mf_data.SentencePieceTokenizer(str(cache / "spm.model"))
    assert tokenizer.vocab_size == 300 and len(dataset) > 300
    # every document ends with the tokenizer's end-of-sentence id (preprocess --append-eod)
    assert all(int(dataset[i][-1]) == tokenizer.eod for i in range(0, len(dataset), 50))
    assert not list(cache.glob(".building-*"))
    before = (cache / "pydoc_text_document.bin").stat().st_mtime_ns
    with caplog.at_level("INFO", logger="mf_trainer"):
        ensure_demo_corpus(extra, str(cache / "spm.model"), model_vocab=512)
    assert "using the cached" in caplog.text
    assert (cache / "pydoc_text_document.bin").stat().st_mtime_ns == before
    check_eod(extra, str(cache / "spm.model"))
    with pytest.raises(TrainerConfigError, match=r"config.eod: 5 is not the end-of-document id of .*\(2\)"):
        check_eod({"config": {"eod": 5}}, str(cache / "spm.model"))


@pytest.mark.parametrize("extra, tokenizer, message", [
    ({"demo_corpus": {"vocab": 10}, "config": {"data_path": ["1", "x_text_document"]}}, "t.model",
     "demo_corpus.vocab: unknown key; accepted: vocab_size"),
    ({"demo_corpus": {}, "config": {"data_path": ["1", "a_text_document", "1", "b_text_document"]}}, "t.model",
     "needs config.data_path with exactly one prefix"),
    ({"demo_corpus": {}, "config": {"data_path": ["1", "corpus"]}}, "t.model", "'<name>_text_document'"),
    ({"demo_corpus": {}, "config": {"data_path": ["1", "x_text_document"]}}, "", "tokenizer.path: the demo corpus needs it"),
    ({"demo_corpus": {"vocab_size": 4000}, "config": {"data_path": ["1", "x_text_document"]}}, "t.model",
     "vocab_size: 4000 exceeds model.vocab_size 2000"),
])
def test_demo_corpus_settings_are_checked(tmp_path, extra, tokenizer, message):
    with pytest.raises(TrainerConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ensure_demo_corpus(extra, str(tmp_path / tokenizer) if tokenizer else "", model_vocab=2000)
    assert not list(tmp_path.iterdir())


def _user_dir(tmp_path, files):
    data = tmp_path / "my_data"
    data.mkdir()
    for name, content in files.items():
        (data / name).write_bytes(content)
    return data


@pytest.mark.parametrize("files, tokenizer_in, message", [
    ({"mine_text_document.idx": b"MMIDIDX my index"}, "data",
     "data_path: {data}/mine_text_document.bin is missing but {data}/mine_text_document.idx exists"),
    ({"mine_text_document.bin": b"my tokens"}, "data",
     "data_path: {data}/mine_text_document.idx is missing but {data}/mine_text_document.bin exists"),
    ({"notes.txt": b"my notes", "raw.jsonl": b"{}"}, "data",
     "{data} holds other files (notes.txt, raw.jsonl): the demo corpus writes only into a directory of its own"),
    ({}, "elsewhere", "tokenizer.path: {tok} is missing; the demo corpus trains it only inside its own cache directory"),
])
def test_demo_corpus_never_writes_over_a_users_data(tmp_path, files, tokenizer_in, message):
    """Issue 17: an .idx without its .bin used to get the demo corpus built over it (the .idx
    replaced, corpus.jsonl written beside it, training on the wrong data with exit 0)."""
    data = _user_dir(tmp_path, files)
    tok = (data if tokenizer_in == "data" else tmp_path / "elsewhere") / "spm.model"
    extra = {"config": {"data_path": ["1", str(data / "mine_text_document")]}, "demo_corpus": {"vocab_size": 300}}
    with pytest.raises(TrainerConfigError) as error:
        ensure_demo_corpus(extra, str(tok), model_vocab=512)
    assert message.format(data=data, tok=tok) in str(error.value)
    assert {p.name: p.read_bytes() for p in data.iterdir()} == files  # nothing written, nothing replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my_data"]


def test_deterministic_switch_reaches_mindspore():
    import mindspore as ms

    setup_context("CPU", 1, 0, True)
    assert ms.get_context("deterministic") == "ON"
    setup_context("CPU", 1, 0, False)
    assert ms.get_context("deterministic") == "OFF"
