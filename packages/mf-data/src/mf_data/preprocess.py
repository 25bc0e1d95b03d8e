"""jsonl -> Megatron `.bin/.idx`, tokenized with a sentencepiece model, on N worker processes.

For each `--json-keys` key K the output is `<output_prefix>_K_document.{bin,idx}`, as Megatron's
`tools/preprocess_data.py` names it. Each input line is one document; a string value is one
sequence, a list of strings one sequence per entry (empty ones dropped); `append_eod` adds the
model's end-of-sentence id to the document's last sequence. A document with no tokens is kept as
a document without sequences, like Megatron, so the outputs of several keys stay aligned line
for line. Token dtype: uint16 for a vocabulary below 65500, else int32 (Megatron's rule).

Lines are read by the main thread and encoded in chunks by `workers` threads sharing one model
(with `workers=1` the main thread encodes them itself); chunks are written back in input order.
Threads, not processes: sentencepiece releases the GIL while it encodes a batch (two threads
encode 1.98x one here), so no chunk or token array has to cross a process boundary and no
helper has to start and load the model. `workers` should match the cores available. Outputs are built under temporary
names and renamed at the end; on any error (or a bad line with `strict`) nothing is left behind and
existing files are untouched. Existing outputs are refused unless `overwrite`.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

from .errors import InputError
from .indexed_dataset import DType, IndexedDatasetBuilder, get_bin_path, get_idx_path
from .jsonl import BadLines, parse_lines, read_line_chunks
from .tokenizer import SentencePieceTokenizer


@dataclass
class Chunk:
    path: str
    first_line: int
    lines: list[bytes]


@dataclass
class Encoded:
    """One chunk, encoded: per key the flat tokens, sequence lengths and sequences per document."""

    tokens: dict[str, np.ndarray]
    lengths: dict[str, np.ndarray]
    per_doc: dict[str, np.ndarray]
    documents: int
    empty: dict[str, int]
    bad: list[tuple[str, int, str]] = field(default_factory=list)
    nbytes: int = 0


def encode_chunk(chunk: Chunk, json_keys: Sequence[str], append_eod: int | None, tok: SentencePieceTokenizer) -> Encoded:
    docs, errors = parse_lines(chunk.lines, json_keys)
    bad = [(chunk.path, chunk.first_line + offset, reason) for offset, reason in errors]
    out = Encoded({}, {}, {}, len(docs), {}, bad, sum(map(len, chunk.lines)) + len(chunk.lines))  # + newlines
    for key in json_keys:
        texts: list[str] = []
        counts: list[int] = []
        for doc in docs:
            value = doc[key]
            if isinstance(value, list):
                texts.extend(value)
                counts.append(len(value))
            else:
                texts.append(value)
                counts.append(1)
        tokens, seq_lengths = _join(tok.encode_arrays(texts) if texts else [], counts, append_eod)
        kept = seq_lengths > 0  # empty sequences are dropped, as in Megatron
        doc_of = np.repeat(np.arange(len(counts)), counts)
        per_doc = np.bincount(doc_of[kept], minlength=len(counts)) if len(counts) else np.zeros(0, np.int64)
        out.tokens[key] = tokens
        out.lengths[key] = seq_lengths[kept]
        out.per_doc[key] = per_doc.astype(np.int64)
        out.empty[key] = int((per_doc == 0).sum())
    return out


def _join(arrays: list[np.ndarray], counts: list[int], append_eod: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The sequences back to back (int32) and their lengths, with `append_eod` after each
    document's last non-empty sequence (a document with no tokens gets none, as in Megatron)."""
    seq_lengths = np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays))
    flat = np.concatenate(arrays).astype(np.int32, copy=False) if arrays else np.zeros(0, np.int32)
    if append_eod is None or not arrays:
        return flat, seq_lengths
    nonempty = np.flatnonzero(seq_lengths)
    if nonempty.size == 0:
        return flat, seq_lengths
    doc_of = np.repeat(np.arange(len(counts)), counts)[nonempty]
    last = nonempty[np.append(doc_of[1:] != doc_of[:-1], True)]  # per document, its last non-empty sequence
    flat = np.insert(flat, np.cumsum(seq_lengths)[last], np.int32(append_eod))
    seq_lengths[last] += 1
    return flat, seq_lengths


def encode_threads(tasks: Iterator[tuple], workers: int, fn: Callable[..., Any]) -> Iterator[Any]:
    """`fn(*task)` of every task on `workers` threads, results in input order; at most 2 x `workers`
    tasks are read ahead (memory stays bounded on a corpus of any size). For GIL-releasing work."""
    with ThreadPoolExecutor(workers, thread_name_prefix="mf-data-encode") as executor:
        pending: deque = deque()
        for task in tasks:
            pending.append(executor.submit(fn, *task))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def encode_pool(tasks: Iterator[Any], workers: int, initializer: Callable[..., None], initargs: tuple,
                remote: Callable[[Any], Any]) -> tuple[Any, Iterator[Any]]:
    """(pool, every task's result in input order) from `workers` helper processes (for encoders
    that hold the GIL: `mf-data sft-preprocess`'s templates and HF tokenizers in Python).

    The main process only reads lines, hands them out and writes results: it does not encode.
    It used to encode too (N - 1 helpers), but sentencepiece keeps the GIL while it encodes, so
    multiprocessing's feeder and result threads stalled behind it, and a helper blocked writing
    a finished chunk into its full result pipe sat idle: on 2 cores, two helpers beat main + one
    helper (figures in the CHANGELOG, 0.3.0). `imap` keeps input order; what is read ahead is
    bounded by the pipes' capacity.
    """
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    pool = ctx.Pool(workers, initializer=initializer, initargs=initargs)
    return pool, pool.imap(remote, tasks, chunksize=1)


def read_chunks(paths: Sequence[str], chunk_lines: int) -> Iterator[Chunk]:
    for path in paths:
        for first, lines in read_line_chunks(path, chunk_lines):
            yield Chunk(path, first, lines)


def usable_workers(workers: int, log: IO[str]) -> int:
    """`workers`, at most the CPUs this process may use: encoding is CPU-bound, so more processes
    only compete (and a million would fork without bound). Said once on `log` when clamped."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InputError(f"--workers must be at least 1, got {workers!r}")
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count() or 1
    if workers > cpus:
        print(f"--workers {workers}: this machine gives {cpus} CPU(s) to this process; using {cpus}", file=log)
        return cpus
    return workers


def check_output_names(output_prefix: str, names: Sequence[str], flag: str) -> None:
    """Names that become part of output file names must be plain: `--json-keys ../../x` must not
    move the output elsewhere."""
    for name in names:
        if not isinstance(name, str) or not name or any(c in name for c in ("/", "\\", "\x00")) or name in (".", ".."):
            raise InputError(f"{flag}: {name!r} cannot be part of a file name (no path separators); it would "
                             f"name the output {output_prefix}_{name}_document")


def open_builders(paths: dict[str, str], dtypes: dict[str, Any]) -> dict[str, IndexedDatasetBuilder]:
    """One builder per output (temporary files beside it); an output that cannot be written is one
    InputError naming it, and nothing is left behind."""
    builders: dict[str, IndexedDatasetBuilder] = {}
    try:
        for key, path in paths.items():
            builders[key] = IndexedDatasetBuilder(path, dtype=dtypes[key], overwrite=True)
    except OSError as err:
        for builder in builders.values():
            builder.abort()
        raise InputError(f"{err.filename or paths[key]}: cannot write the output ({err.strerror or err})") from None
    return builders


@contextmanager
def writing(builders: dict[str, IndexedDatasetBuilder], bar: Any) -> Iterator[None]:
    """The body fills `builders`: when it fails, every builder is aborted (its partial files
    removed); the progress bar is closed either way."""
    try:
        yield
    except BaseException:
        for builder in builders.values():
            builder.abort()
        raise
    finally:
        if bar is not None:
            bar.close()


def check_outputs(output_prefix: str, prefixes, overwrite: bool) -> None:
    """The output directory exists, and no `.bin/.idx` of `prefixes` is there unless `overwrite`."""
    out_dir = os.path.dirname(os.path.abspath(output_prefix))
    if not os.path.isdir(out_dir):
        raise InputError(f"{out_dir}: output directory does not exist")
    for prefix in prefixes:
        for path in (get_bin_path(prefix), get_idx_path(prefix)):
            if os.path.exists(path) and not overwrite:
                raise InputError(f"{path}: exists; refusing to overwrite (pass --overwrite)")


def output_prefixes(output_prefix: str, json_keys: Sequence[str]) -> dict[str, str]:
    return {key: f"{output_prefix}_{key}_document" for key in json_keys}


def preprocess(
    inputs: Sequence[str],
    tokenizer_model: str,
    output_prefix: str,
    json_keys: Sequence[str] = ("text",),
    append_eod: bool = False,
    workers: int = 1,
    strict: bool = False,
    overwrite: bool = False,
    chunk_lines: int = 512,
    progress: bool | None = None,
    log: IO[str] | None = None,
) -> dict[str, Any]:
    """Tokenize `inputs` into one `.bin/.idx` pair per key; returns the summary figures."""
    log = log or sys.stderr
    workers = usable_workers(workers, log)
    if not json_keys or len(set(json_keys)) != len(json_keys):
        raise InputError(f"--json-keys must name distinct keys, got {list(json_keys)}")
    check_output_names(output_prefix, json_keys, "--json-keys")
    for path in inputs:
        if not os.path.isfile(path):
            raise InputError(f"{path}: input file not found")
    tokenizer = SentencePieceTokenizer(tokenizer_model)
    eod = None
    if append_eod:
        eod = tokenizer.eod
        if eod is None:
            raise InputError(f"{tokenizer_model}: the model has no end-of-sentence piece, so --append-eod has no id to add")
    dtype = DType.optimal_dtype(tokenizer.vocab_size)
    prefixes = output_prefixes(output_prefix, json_keys)
    check_outputs(output_prefix, prefixes.values(), overwrite)

    builders = open_builders({key: get_bin_path(p) for key, p in prefixes.items()}, dict.fromkeys(prefixes, dtype))
    bad = BadLines()
    totals = {"documents": 0, "tokens": dict.fromkeys(json_keys, 0), "empty": dict.fromkeys(json_keys, 0)}
    started = time.perf_counter()
    results: Iterator[Encoded] = iter(())
    bar = progress_bar(inputs, progress)
    with writing(builders, bar):
        try:
            tasks = ((chunk, list(json_keys), eod) for chunk in read_chunks(inputs, chunk_lines))
            if workers == 1:
                results = (encode_chunk(c, k, e, tokenizer) for c, k, e in tasks)
            else:
                results = encode_threads(((c, k, e, tokenizer) for c, k, e in tasks), workers, encode_chunk)
            for enc in results:
                bad.record(enc.bad, strict)
                totals["documents"] += enc.documents
                for key, builder in builders.items():
                    builder.add_documents(enc.tokens[key], enc.lengths[key], enc.per_doc[key])
                    totals["tokens"][key] += int(enc.tokens[key].size)
                    totals["empty"][key] += enc.empty[key]
                if bar is not None:
                    bar.update(enc.nbytes)
            if totals["documents"] == 0:
                raise InputError(f"no documents in {', '.join(inputs)} (every line was blank or bad)")
            for key, builder in builders.items():
                builder.finalize(get_idx_path(prefixes[key]))
        finally:
            close = getattr(results, "close", None)
            if close is not None:   # stops the encoding threads (after the chunks they hold) on an error
                close()
    seconds = time.perf_counter() - started
    all_tokens = sum(totals["tokens"].values())
    summary = {
        "documents": totals["documents"],
        "tokens": totals["tokens"],
        "empty_documents": totals["empty"],
        "bad_lines": bad.count,
        "seconds": seconds,
        "tokens_per_second": all_tokens / seconds if seconds > 0 else float("inf"),
        "outputs": prefixes,
        "dtype": np.dtype(dtype).name,
        "vocab_size": tokenizer.vocab_size,
    }
    for key, prefix in prefixes.items():
        print(f"{prefix}.{{bin,idx}}: {totals['documents']} documents, {totals['tokens'][key]} tokens "
              f"({np.dtype(dtype).name}), {totals['empty'][key]} empty", file=log)
    print(f"preprocessed {totals['documents']} documents, {all_tokens} tokens in {seconds:.2f} s "
          f"({summary['tokens_per_second']:,.0f} tokens/s, {workers} worker(s))", file=log)
    if bad.count:
        print(bad.summary(), file=log)
    return summary


def progress_bar(inputs: Sequence[str], enabled: bool | None) -> Any:
    if enabled is False:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # declared dependency; degrade to no bar rather than fail the job
        return None
    plain = all(not _is_gzip(p) for p in inputs)
    total = sum(os.path.getsize(p) for p in inputs) if plain else None
    # disable=None: a bar on a terminal only, so logs and pipes stay clean unless asked.
    return tqdm(total=total, unit="B", unit_scale=True, desc="preprocess", disable=None if enabled is None else False,
                file=sys.stderr)


def _is_gzip(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"
