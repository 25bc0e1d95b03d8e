"""The multi-process preprocess schedule: helpers encode, the main process only reads and writes,
and every chunk comes back in input order, identical to a serial encode."""

from __future__ import annotations

import os

import numpy as np

from mf_data.preprocess import Chunk, _init_worker, encode_chunk, encode_pool
from mf_data.tokenizer import SentencePieceTokenizer


def _encode_and_say_who(task):
    chunk, keys, eod = task
    return os.getpid(), encode_chunk(chunk, keys, eod)


def test_helpers_encode_every_chunk_in_input_order(demo_corpus, spm_model):
    tok = SentencePieceTokenizer(str(spm_model))
    lines = demo_corpus.read_bytes().splitlines(keepends=True)[:60]
    chunks = [Chunk("corpus.jsonl", 1 + 3 * k, lines[3 * k:3 * k + 3]) for k in range(20)]
    pool, results = encode_pool(iter((c, ["text"], tok.eod) for c in chunks), 2, _init_worker, (str(spm_model),),
                                _encode_and_say_who)
    try:
        got = list(results)
    finally:
        pool.terminate()
        pool.join()
    want = [encode_chunk(c, ["text"], tok.eod, tok) for c in chunks]
    assert len(got) == len(want) == 20
    assert os.getpid() not in {pid for pid, _ in got}, "the main process must not encode"
    for (_, g), w in zip(got, want):
        np.testing.assert_array_equal(g.tokens["text"], w.tokens["text"])
        np.testing.assert_array_equal(g.lengths["text"], w.lengths["text"])
        np.testing.assert_array_equal(g.per_doc["text"], w.per_doc["text"])


def test_end_of_document_goes_after_the_last_non_empty_sequence(spm_model):
    """Pre-split documents: empty sentences are dropped, the EOD id follows the last kept one,
    a document with no tokens stays a document without sequences (Megatron's rules)."""
    tok = SentencePieceTokenizer(str(spm_model))
    lines = [b'{"text": ["First part.", "Second part.", ""]}\n', b'{"text": ["", ""]}\n', b'{"text": "Whole."}\n',
             b'\n', b'{"text": ["", "Only the second."]}\n']
    enc = encode_chunk(Chunk("x.jsonl", 1, lines), ["text"], tok.eod, tok)
    parts = [tok.encode([t])[0] for t in ("First part.", "Second part.", "Whole.", "Only the second.")]
    expected = [parts[0], parts[1] + [tok.eod], parts[2] + [tok.eod], parts[3] + [tok.eod]]
    assert enc.documents == 4 and enc.per_doc["text"].tolist() == [2, 0, 1, 1] and enc.empty["text"] == 1
    assert enc.lengths["text"].tolist() == [len(e) for e in expected]
    assert enc.tokens["text"].tolist() == [t for e in expected for t in e]
