"""Where `mf-data preprocess` spends its time, phase by phase, and what that allows 2 workers.

    python benchmarks/profile_preprocess.py [--copies 24] [--vocab 4000]

On data_bench's preprocess corpus (the demo documents repeated `--copies` times, a sentencepiece
model trained on them), `preprocess` runs with 1 and then 2 workers while each phase is timed on
the thread that runs it: reading the jsonl, parsing its lines (JSON, holds the GIL), encoding
(sentencepiece, releases the GIL inside a batch), joining the sequences and EOD ids (numpy), and
writing (the builders' `add_documents`, on the main thread). The 1-worker run gives each phase's
share of the serial work; the bound printed for 2 workers is Amdahl's with every phase but encode
(read, parse, join, write and the Python around them, which hold the GIL most of their time) run
one at a time and encode split over two threads. The 2-worker run shows how close the real pipeline gets. Phase timers wrap
mf-data's own functions for the run (a profile, not a benchmark: not in the nox `bench` session).
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import sys
import tempfile
import threading
import time
from collections import defaultdict
from contextlib import redirect_stderr

import data_bench


class PhaseClock:
    """Seconds per phase, summed over threads; each wrapped call times itself with perf_counter."""

    def __init__(self):
        self.seconds = defaultdict(float)
        self.lock = threading.Lock()

    def wrap(self, phase: str, fn):
        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                with self.lock:
                    self.seconds[phase] += time.perf_counter() - t
        return timed


def run(corpus: str, model: str, out: str, workers: int) -> tuple[float, dict, int]:
    """(wall seconds, seconds per phase, tokens) of one preprocess run with the phases timed."""
    # The modules themselves (mf_data's __init__ exports a function named preprocess).
    pre = importlib.import_module("mf_data.preprocess")
    indexed_dataset = importlib.import_module("mf_data.indexed_dataset")
    tokenizer = importlib.import_module("mf_data.tokenizer")
    clock = PhaseClock()
    saved = (pre.read_line_chunks, pre.parse_lines, pre._join, tokenizer.SentencePieceTokenizer.encode_arrays,
             indexed_dataset.IndexedDatasetBuilder.add_documents)

    def read_timed(path, chunk_lines):  # time each chunk's read, not the consumer's work between them
        chunks = saved[0](path, chunk_lines)
        while True:
            t = time.perf_counter()
            try:
                item = next(chunks)
            except StopIteration:
                return
            finally:
                with clock.lock:
                    clock.seconds["read"] += time.perf_counter() - t
            yield item

    pre.read_line_chunks = read_timed
    pre.parse_lines = clock.wrap("parse", saved[1])
    pre._join = clock.wrap("join", saved[2])
    tokenizer.SentencePieceTokenizer.encode_arrays = clock.wrap("encode", saved[3])
    indexed_dataset.IndexedDatasetBuilder.add_documents = clock.wrap("write", saved[4])
    try:
        t = time.perf_counter()
        with redirect_stderr(io.StringIO()):
            summary = pre.preprocess([corpus], model, out, append_eod=True, workers=workers, overwrite=True, progress=False)
        wall = time.perf_counter() - t
    finally:
        (pre.read_line_chunks, pre.parse_lines, pre._join, tokenizer.SentencePieceTokenizer.encode_arrays,
         indexed_dataset.IndexedDatasetBuilder.add_documents) = saved
    return wall, dict(clock.seconds), sum(summary["tokens"].values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=24, help="demo corpus copies (data_bench's default 24)")
    parser.add_argument("--vocab", type=int, default=4000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        corpus, model = data_bench.preprocess_inputs(tmp, args.copies, args.vocab)
        out = os.path.join(tmp, "pre")
        run(corpus, model, out, 1)  # warm the page cache and the tokenizer
        wall1, phases1, tokens = run(corpus, model, out, 1)
        wall2, phases2, _ = run(corpus, model, out, 2)
    print(f"profile_preprocess: {tokens:,} tokens; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    other1 = wall1 - sum(phases1.values())
    print(f"{'phase':28s} {'1 worker s':>10s} {'share':>6s} {'2 workers s (thread sum)':>24s}")
    for phase in ("read", "parse", "encode", "join", "write"):
        print(f"{phase:28s} {phases1.get(phase, 0):10.3f} {100 * phases1.get(phase, 0) / wall1:5.1f}% "
              f"{phases2.get(phase, 0):24.3f}")
    print(f"{'other (Python around them)':28s} {other1:10.3f} {100 * other1 / wall1:5.1f}%")
    encode = phases1.get("encode", 0)
    serial = wall1 - encode
    print(f"preprocess 1 worker {wall1:.3f} s, 2 workers {wall2:.3f} s: speed-up {wall1 / wall2:.2f}; Amdahl bound "
          f"{wall1 / (serial + encode / 2):.2f} with everything but encode ({100 * serial / wall1:.0f}% of the serial "
          "run) one at a time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
