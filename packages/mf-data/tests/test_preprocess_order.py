"""The 2-worker preprocess schedule: the main process encodes whatever its helpers cannot take, and
every chunk still comes back in input order, identical to a serial encode."""

from __future__ import annotations

import sys

import numpy as np

from mf_data.preprocess import Chunk, _encode_in_worker, encode_chunk, encode_in_order
from mf_data.tokenizer import SentencePieceTokenizer


class _Slow:
    """An AsyncResult that never finishes by itself: the helper is always busy."""

    def __init__(self, task, log):
        self.task, self.log = task, log

    def ready(self) -> bool:
        return False

    def get(self):
        self.log.append(("helper", self.task[0].first_line))
        return _encode_in_worker(self.task)


class _BusyPool:
    def __init__(self, log):
        self.log = log

    def apply_async(self, fn, args):
        assert fn is _encode_in_worker
        return _Slow(args[0], self.log)


def test_main_process_encodes_when_helpers_are_busy_and_order_is_kept(demo_corpus, spm_model, monkeypatch):
    pre = sys.modules["mf_data.preprocess"]      # the package exports a function of the same name

    tok = SentencePieceTokenizer(str(spm_model))
    monkeypatch.setattr(pre, "_worker_tokenizer", tok)      # what the helper's initializer loads
    lines = demo_corpus.read_bytes().splitlines(keepends=True)[:60]
    chunks = [Chunk("corpus.jsonl", 1 + 3 * k, lines[3 * k:3 * k + 3]) for k in range(20)]
    tasks = [(c, ["text"], tok.eod) for c in chunks]
    log: list = []
    got = list(encode_in_order(iter(tasks), _BusyPool(log), 1, _encode_in_worker,
                               lambda task: encode_chunk(*task, tok)))
    want = [encode_chunk(c, ["text"], tok.eod, tok) for c in chunks]
    assert len(got) == len(want) == 20
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.tokens["text"], w.tokens["text"])
        np.testing.assert_array_equal(g.lengths["text"], w.lengths["text"])
    # Two chunks queued with the single helper and the next ones encoded here, until 13 results are
    # held (the limit for one helper is 12): the oldest is then collected from the helper, whose
    # free slots take the next two chunks (lines 40 and 43); the rest is encoded here.
    assert [first for who, first in log] == [1, 4, 40, 43]
