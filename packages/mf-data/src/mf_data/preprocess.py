"""jsonl -> Megatron `.bin/.idx`, tokenized with a sentencepiece model, on N worker processes.

For each `--json-keys` key K the output is `<output_prefix>_K_document.{bin,idx}`, as Megatron's
`tools/preprocess_data.py` names it. Each input line is one document; a string value is one
sequence, a list of strings one sequence per entry (empty ones dropped); `append_eod` adds the
model's end-of-sentence id to the document's last sequence. A document with no tokens is kept as
a document without sequences, like Megatron, so the outputs of several keys stay aligned line
for line. Token dtype: uint16 for a vocabulary below 65500, else int32 (Megatron's rule).

Lines are read by the main process and encoded in chunks by `workers` processes, each with its
own model and one thread: the main process is one of them, so `workers=2` starts one helper (on
a 2-core machine a third process would only compete with the two encoders). The main process
keeps its helpers busy first and encodes a chunk itself whenever they have enough queued; chunks
are written back in input order. Outputs are built under temporary names and
renamed at the end; on any error (or a bad line with `strict`) nothing is left behind and
existing files are untouched. Existing outputs are refused unless `overwrite`.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import IO, Any

import numpy as np

from .errors import InputError
from .indexed_dataset import DType, IndexedDatasetBuilder, get_bin_path, get_idx_path
from .jsonl import BadLines, LineError, parse_line, read_lines
from .tokenizer import SentencePieceTokenizer

_worker_tokenizer: SentencePieceTokenizer | None = None


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


def _init_worker(model_path: str) -> None:
    global _worker_tokenizer
    _worker_tokenizer = SentencePieceTokenizer(model_path)


def encode_chunk(chunk: Chunk, json_keys: Sequence[str], append_eod: int | None, tokenizer: SentencePieceTokenizer | None = None) -> Encoded:
    tok = tokenizer or _worker_tokenizer
    assert tok is not None
    docs: list[dict[str, Any]] = []
    bad: list[tuple[str, int, str]] = []
    for offset, line in enumerate(chunk.lines):
        try:
            doc = parse_line(line, json_keys)
        except LineError as err:
            bad.append((chunk.path, chunk.first_line + offset, str(err)))
            continue
        if doc is not None:
            docs.append(doc)
    out = Encoded({}, {}, {}, len(docs), {}, bad, sum(len(line) for line in chunk.lines))
    for key in json_keys:
        texts: list[str] = []
        counts: list[int] = []
        for doc in docs:
            value = doc[key]
            parts = value if isinstance(value, list) else [value]
            texts.extend(parts)
            counts.append(len(parts))
        ids = tok.encode(texts) if texts else []
        if append_eod is not None:
            # The document's last non-empty sequence gets the end-of-document id.
            pos = 0
            for n in counts:
                for j in range(pos + n - 1, pos - 1, -1):
                    if ids[j]:
                        ids[j].append(append_eod)
                        break
                pos += n
        seq_lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        kept = seq_lengths > 0  # empty sequences are dropped, as in Megatron
        doc_of = np.repeat(np.arange(len(counts)), counts)
        per_doc = np.bincount(doc_of[kept], minlength=len(counts)) if len(counts) else np.zeros(0, np.int64)
        flat = np.fromiter(chain.from_iterable(ids), dtype=np.int32, count=int(seq_lengths.sum()))
        empty = int((per_doc == 0).sum())
        lengths = seq_lengths[kept]
        out.tokens[key] = flat
        out.lengths[key] = lengths
        out.per_doc[key] = per_doc.astype(np.int64)
        out.empty[key] = empty
    return out


def _encode_in_worker(args: tuple[Chunk, Sequence[str], int | None]) -> Encoded:
    return encode_chunk(*args)


class _Ready:
    """A chunk the main process encoded, shaped like the pool's AsyncResult."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def ready(self) -> bool:
        return True

    def get(self) -> Any:
        return self.value


def encode_in_order(tasks: Iterator[Any], pool, helpers: int, remote: Callable[[Any], Any],
                    local: Callable[[Any], Any]) -> Iterator[Any]:
    """Every task's result, in input order, from `helpers` pool processes (`remote(task)`, a
    picklable function) plus this process (`local(task)`).

    A task goes to the pool while fewer than two per helper are queued there (so a helper never
    waits for the main process); otherwise the main process encodes it. Finished results are
    handed on from the front as soon as they are ready, and at most `limit` are held back.
    """
    queued_max, limit = 2 * helpers, 4 * helpers + 8
    pending: deque = deque()
    for task in tasks:
        in_pool = sum(1 for r in pending if not isinstance(r, _Ready) and not r.ready())
        if in_pool < queued_max:
            pending.append(pool.apply_async(remote, (task,)))
        else:
            pending.append(_Ready(local(task)))
        while pending and (pending[0].ready() or len(pending) > limit):
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()


def _chunks(paths: Sequence[str], chunk_lines: int) -> Iterator[Chunk]:
    for path in paths:
        lines: list[bytes] = []
        first = 1
        for number, line in read_lines(path):
            if not lines:
                first = number
            lines.append(line)
            if len(lines) >= chunk_lines:
                yield Chunk(path, first, lines)
                lines = []
        if lines:
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
    out_dir = os.path.dirname(os.path.abspath(output_prefix))
    if not os.path.isdir(out_dir):
        raise InputError(f"{out_dir}: output directory does not exist")
    for prefix in prefixes.values():
        for path in (get_bin_path(prefix), get_idx_path(prefix)):
            if os.path.exists(path) and not overwrite:
                raise InputError(f"{path}: exists; refusing to overwrite (pass --overwrite)")

    builders = open_builders({key: get_bin_path(p) for key, p in prefixes.items()}, dict.fromkeys(prefixes, dtype))
    bad = BadLines()
    totals = {"documents": 0, "tokens": dict.fromkeys(json_keys, 0), "empty": dict.fromkeys(json_keys, 0)}
    started = time.perf_counter()
    pool = None
    bar = _progress_bar(inputs, progress)
    try:
        tasks = ((chunk, list(json_keys), eod) for chunk in _chunks(inputs, chunk_lines))
        if workers == 1:
            results: Iterator[Encoded] = (encode_chunk(c, k, e, tokenizer) for c, k, e in tasks)
        else:
            ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
            pool = ctx.Pool(workers - 1, initializer=_init_worker, initargs=(tokenizer.model_path,))
            results = encode_in_order(tasks, pool, workers - 1, _encode_in_worker,
                                      lambda task: encode_chunk(*task, tokenizer))
        for enc in results:
            for path, number, reason in enc.bad:
                if strict:
                    raise InputError(f"{path}:{number}: {reason} (--strict)")
                bad.add(f"{path}:{number}", reason)
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
    except BaseException:
        for builder in builders.values():
            builder.abort()
        raise
    finally:
        if bar is not None:
            bar.close()
        if pool is not None:
            pool.terminate()
            pool.join()
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


def _progress_bar(inputs: Sequence[str], enabled: bool | None) -> Any:
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
