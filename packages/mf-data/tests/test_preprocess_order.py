"""The preprocess schedules: encoding threads (`mf-data preprocess`) and helper processes
(`encode_pool`, sft-preprocess) hand every chunk back in input order, identical to a serial encode."""

from __future__ import annotations

import os
import random
import threading
import time

import numpy as np

from mf_data.preprocess import Chunk, encode_chunk, encode_pool, encode_threads
from mf_data.tokenizer import SentencePieceTokenizer

_tokenizer: SentencePieceTokenizer | None = None


def _init(model_path: str) -> None:
    global _tokenizer
    _tokenizer = SentencePieceTokenizer(model_path)


def _encode_and_say_who(task):
    chunk, keys, eod = task
    return os.getpid(), encode_chunk(chunk, keys, eod, _tokenizer)


def read_chunks(demo_corpus):
    lines = demo_corpus.read_bytes().splitlines(keepends=True)[:60]
    return [Chunk("corpus.jsonl", 1 + 3 * k, lines[3 * k:3 * k + 3]) for k in range(20)]


def _assert_same(got, want):
    assert len(got) == len(want) == 20
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.tokens["text"], w.tokens["text"])
        np.testing.assert_array_equal(g.lengths["text"], w.lengths["text"])
        np.testing.assert_array_equal(g.per_doc["text"], w.per_doc["text"])


def test_threads_encode_every_chunk_in_input_order(demo_corpus, spm_model):
    tok = SentencePieceTokenizer(str(spm_model))
    chunks = read_chunks(demo_corpus)
    threads = set()
    rng = random.Random(0)
    delays = [rng.random() * 0.01 for _ in chunks]   # finish out of order

    def encode(chunk, keys, eod, tokenizer, delay):
        threads.add(threading.get_ident())
        time.sleep(delay)
        return encode_chunk(chunk, keys, eod, tokenizer)

    got = list(encode_threads(((c, ["text"], tok.eod, tok, d) for c, d in zip(chunks, delays)), 2, encode))
    _assert_same(got, [encode_chunk(c, ["text"], tok.eod, tok) for c in chunks])
    assert threading.get_ident() not in threads and len(threads) == 2


def test_threads_read_ahead_is_bounded():
    started = []

    def tasks():
        for k in range(100):
            started.append(k)
            yield (k,)

    results = encode_threads(tasks(), 2, lambda k: k)
    assert next(results) == 0
    assert len(started) <= 5        # 2 x workers submitted, plus the one that released the first
    assert list(results) == list(range(1, 100))


def test_helpers_encode_every_chunk_in_input_order(demo_corpus, spm_model):
    tok = SentencePieceTokenizer(str(spm_model))
    chunks = read_chunks(demo_corpus)
    pool, results = encode_pool(iter((c, ["text"], tok.eod) for c in chunks), 2, _init, (str(spm_model),),
                                _encode_and_say_who)
    try:
        got = list(results)
    finally:
        pool.terminate()
        pool.join()
    assert os.getpid() not in {pid for pid, _ in got}, "the main process must not encode"
    _assert_same([enc for _, enc in got], [encode_chunk(c, ["text"], tok.eod, tok) for c in chunks])


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
