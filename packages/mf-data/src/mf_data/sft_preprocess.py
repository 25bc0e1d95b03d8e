"""`mf-data preprocess-sft`: chat/instruction jsonl -> tokens and a loss-mask channel.

Output for `--output-prefix P` (see `mf_data.sft_indexed` for the format):

    P_sft_document.{bin,idx}             token ids, one document (one sequence) per conversation
    P_sft_document_loss_mask.{bin,idx}   uint8, 1 on response tokens; same documents and lengths

Each line is parsed (`mf_data.chat`), rendered and tokenised (`mf_data.sft_encode`). With
`seq_length`, a conversation longer than it is truncated to its first `seq_length` tokens (the
policy the dataset applies too), or dropped with `drop_long`; one left with no response token
after its first (the first token is never predicted) is dropped. Every case is counted in the
summary. Bad lines are skipped and reported with file:line (fatal with `strict`); `workers` processes
encode, the main one included, and results are written in input order, as in `mf-data preprocess`. Both pairs are
built under temporary names; the token index is renamed into place last.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

from .chat import SFTKeys, conversation_from_json
from .errors import InputError
from .indexed_dataset import DType, get_bin_path, get_idx_path
from .jsonl import BadLines, LineError, parse_json_line
from .preprocess import (
    Chunk,
    check_outputs,
    encode_pool,
    open_builders,
    progress_bar,
    read_chunks,
    usable_workers,
    writing,
)
from .sft_encode import ChatEncoder, load_tokenizer
from .sft_indexed import loss_mask_prefix

SFT_SUFFIX = "_sft_document"
_COUNTS = ("samples", "tokens", "response_tokens", "truncated", "dropped_long", "dropped_untrainable")
_worker_encoder: ChatEncoder | None = None


def sft_output_prefix(output_prefix: str) -> str:
    """The dataset prefix `preprocess_sft` writes for `output_prefix` (the YAML's data_path)."""
    return output_prefix + SFT_SUFFIX


@dataclass(frozen=True)
class SFTOptions:
    keys: SFTKeys = SFTKeys()
    seq_length: int | None = None
    drop_long: bool = False


@dataclass
class EncodedSFT:
    """One chunk: flat tokens and mask, per-sample lengths, counts and bad lines."""

    tokens: np.ndarray
    mask: np.ndarray
    lengths: np.ndarray
    counts: dict[str, int]
    bad: list[tuple[str, int, str]] = field(default_factory=list)
    nbytes: int = 0


def _init_worker(tokenizer_path: str, add_bos: bool, use_template: bool) -> None:
    global _worker_encoder
    _worker_encoder = ChatEncoder(load_tokenizer(tokenizer_path), add_bos=add_bos, use_template=use_template)


def encode_sft_chunk(chunk: Chunk, options: SFTOptions, encoder: ChatEncoder | None = None) -> EncodedSFT:
    enc = encoder or _worker_encoder
    assert enc is not None
    counts = dict.fromkeys(_COUNTS, 0)
    tokens: list[int] = []
    mask: list[int] = []
    lengths: list[int] = []
    bad: list[tuple[str, int, str]] = []
    limit = options.seq_length
    for offset, line in enumerate(chunk.lines):
        try:
            obj = parse_json_line(line)
            if obj is None:
                continue
            ids, bits = enc.encode(conversation_from_json(obj, options.keys))
        except LineError as err:
            bad.append((chunk.path, chunk.first_line + offset, str(err)))
            continue
        if limit is not None and len(ids) > limit:
            if options.drop_long:
                counts["dropped_long"] += 1
                continue
            ids, bits = ids[:limit], bits[:limit]
            counts["truncated"] += 1
        if not any(bits[1:]):
            counts["dropped_untrainable"] += 1
            continue
        tokens.extend(ids)
        mask.extend(bits)
        lengths.append(len(ids))
    counts["samples"] = len(lengths)
    counts["tokens"] = len(tokens)
    counts["response_tokens"] = sum(mask)
    return EncodedSFT(np.asarray(tokens, dtype=np.int64), np.asarray(mask, dtype=np.uint8),
                      np.asarray(lengths, dtype=np.int64), counts, bad, sum(len(line) for line in chunk.lines))


def _encode_in_worker(args: tuple[Chunk, SFTOptions]) -> EncodedSFT:
    return encode_sft_chunk(*args)


def preprocess_sft(
    inputs: Sequence[str],
    tokenizer: str,
    output_prefix: str,
    *,
    keys: SFTKeys = SFTKeys(),
    seq_length: int | None = None,
    drop_long: bool = False,
    add_bos: bool = False,
    use_template: bool = True,
    workers: int = 1,
    strict: bool = False,
    overwrite: bool = False,
    chunk_lines: int = 256,
    progress: bool | None = None,
    log: IO[str] | None = None,
) -> dict[str, Any]:
    """Tokenise SFT jsonl into `<output_prefix>_sft_document` plus its loss-mask channel."""
    log = log or sys.stderr
    workers = usable_workers(workers, log)
    if seq_length is not None and (isinstance(seq_length, bool) or seq_length < 2):
        raise InputError(f"--seq-length must be at least 2 (one token and the one it predicts), got {seq_length}")
    if drop_long and seq_length is None:
        raise InputError("--drop-long needs --seq-length (the length beyond which samples are dropped)")
    names = [keys.messages, keys.prompt, keys.response, keys.system]
    if len(set(names)) != len(names):
        raise InputError(f"the messages, prompt, response and system keys must differ, got {names}")
    for path in inputs:
        if not os.path.isfile(path):
            raise InputError(f"{path}: input file not found")
    tok = load_tokenizer(tokenizer)
    encoder = ChatEncoder(tok, add_bos=add_bos, use_template=use_template)
    dtype = DType.optimal_dtype(tok.vocab_size)
    prefix = sft_output_prefix(output_prefix)
    prefixes = {"tokens": prefix, "mask": loss_mask_prefix(prefix)}
    check_outputs(output_prefix, prefixes.values(), overwrite)

    options = SFTOptions(keys, seq_length, drop_long)
    builders = open_builders({"tokens": get_bin_path(prefix), "mask": get_bin_path(prefixes["mask"])},
                             {"tokens": dtype, "mask": np.uint8})
    bad = BadLines()
    totals = dict.fromkeys(_COUNTS, 0)
    started = time.perf_counter()
    pool = None
    bar = progress_bar(inputs, progress)
    with writing(builders, bar):
        try:
            tasks = ((chunk, options) for chunk in read_chunks(inputs, chunk_lines))
            if workers == 1:
                results: Iterator[EncodedSFT] = (encode_sft_chunk(c, o, encoder) for c, o in tasks)
            else:
                pool, results = encode_pool(tasks, workers, _init_worker, (tok.model_path, add_bos, use_template),
                                            _encode_in_worker)
            for enc in results:
                bad.record(enc.bad, strict)
                ones = np.ones(enc.lengths.size, dtype=np.int64)
                builders["tokens"].add_documents(enc.tokens, enc.lengths, ones)
                builders["mask"].add_documents(enc.mask, enc.lengths, ones)
                for key in _COUNTS:
                    totals[key] += enc.counts[key]
                if bar is not None:
                    bar.update(enc.nbytes)
            if totals["samples"] == 0:
                raise InputError(f"no usable samples in {', '.join(inputs)} (every line was blank, bad, too long or "
                                 "left without a response token)")
            builders["mask"].finalize(get_idx_path(prefixes["mask"]))
            builders["tokens"].finalize(get_idx_path(prefix))  # last: the file whose presence makes the pair usable
        finally:
            if pool is not None:
                pool.terminate()
                pool.join()
    seconds = time.perf_counter() - started
    summary: dict[str, Any] = {
        **totals,
        "bad_lines": bad.count,
        "seconds": seconds,
        "tokens_per_second": totals["tokens"] / seconds if seconds > 0 else float("inf"),
        "output": prefix,
        "loss_mask": prefixes["mask"],
        "dtype": np.dtype(dtype).name,
        "vocab_size": tok.vocab_size,
        "template": encoder.template,
        "seq_length": seq_length,
    }
    _report(summary, workers, drop_long, log)
    if bad.count:
        print(bad.summary(), file=log)
    return summary


def _report(s: dict[str, Any], workers: int, drop_long: bool, log: IO[str]) -> None:
    share = 100.0 * s["response_tokens"] / s["tokens"] if s["tokens"] else 0.0
    print(f"{s['output']}.{{bin,idx}}: {s['samples']} samples, {s['tokens']} tokens ({s['dtype']}), "
          f"{s['response_tokens']} response tokens ({share:.1f}%); loss mask in {s['loss_mask']}.{{bin,idx}}", file=log)
    print(f"template: {s['template']}", file=log)
    if s["seq_length"] is not None:
        policy = f"dropped {s['dropped_long']} longer than it (--drop-long)" if drop_long else \
            f"truncated {s['truncated']} to their first {s['seq_length']} tokens"
        print(f"seq_length {s['seq_length']}: {policy}", file=log)
    if s["dropped_untrainable"]:
        print(f"dropped {s['dropped_untrainable']} sample(s) with no response token to predict", file=log)
    print(f"preprocessed {s['samples']} samples, {s['tokens']} tokens in {s['seconds']:.2f} s "
          f"({s['tokens_per_second']:,.0f} tokens/s, {workers} worker(s)); {s['bad_lines']} bad line(s)", file=log)
