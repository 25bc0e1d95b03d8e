"""The `mf-data` command (also `mf data`): preprocess, preprocess-sft, train-tokenizer, inspect,
make-demo-corpus, make-demo-sft.

`main(argv) -> int` returns the exit status: 0 on success, 2 on bad input (one line on stderr,
no traceback), 1 for a failure at run time (an OSError such as a full disk, one line too), 130
when interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from .errors import MFDataError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit status 2) like every other bad input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise _UsageError(f"{self.prog}: error: {message} (see --help)")


class _UsageError(Exception):
    pass


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser(prog: str = "mf-data") -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description="Megatron-compatible data tools: corpora to .bin/.idx and back.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("preprocess", help="tokenize jsonl(.gz) into <prefix>_<key>_document.{bin,idx}")
    p.add_argument("--input", nargs="+", required=True, help="jsonl files, plain or gzip")
    p.add_argument("--json-keys", nargs="+", default=["text"], help="fields to tokenize (default: text)")
    p.add_argument("--tokenizer-model", required=True, help="sentencepiece .model")
    p.add_argument("--output-prefix", required=True, help="outputs are <prefix>_<key>_document.{bin,idx}")
    p.add_argument("--append-eod", action="store_true", help="end every document with the model's eos id")
    p.add_argument("--workers", type=_positive_int, default=1, help="encoding processes (default 1)")
    p.add_argument("--strict", action="store_true", help="stop at the first bad line instead of skipping it")
    p.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    p.add_argument("--chunk-lines", type=_positive_int, default=512, help="lines per work unit (default 512)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    s = sub.add_parser("preprocess-sft", help="tokenize chat/instruction jsonl(.gz) into <prefix>_sft_document "
                       "plus its loss-mask channel")
    s.add_argument("--input", nargs="+", required=True, help="jsonl files, plain or gzip")
    s.add_argument("--tokenizer", required=True, help="sentencepiece .model file, or a Hugging Face tokenizer directory")
    s.add_argument("--output-prefix", required=True, help="outputs are <prefix>_sft_document{,_loss_mask}.{bin,idx}")
    s.add_argument("--seq-length", type=_positive_int, help="truncate longer samples to this many tokens")
    s.add_argument("--drop-long", action="store_true", help="drop samples longer than --seq-length instead")
    s.add_argument("--messages-key", default="messages", help="field of OpenAI-style message lists (default messages)")
    s.add_argument("--prompt-key", default="prompt", help="field of single-turn prompts (default prompt)")
    s.add_argument("--response-key", default="response", help="field of single-turn responses (default response)")
    s.add_argument("--system-key", default="system", help="optional system field of prompt/response lines")
    s.add_argument("--builtin-template", action="store_true", help="ignore the tokenizer's chat template")
    s.add_argument("--add-bos", action="store_true", help="start samples with BOS (built-in template only)")
    s.add_argument("--workers", type=_positive_int, default=1, help="encoding processes (default 1)")
    s.add_argument("--strict", action="store_true", help="stop at the first bad line instead of skipping it")
    s.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    s.add_argument("--chunk-lines", type=_positive_int, default=256, help="lines per work unit (default 256)")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")

    t = sub.add_parser("train-tokenizer", help="train a sentencepiece model on jsonl text")
    t.add_argument("--input", nargs="+", required=True, help="jsonl files, plain or gzip")
    t.add_argument("--json-keys", nargs="+", default=["text"])
    t.add_argument("--vocab-size", type=_positive_int, required=True)
    t.add_argument("--output", required=True, help="path of the .model to write")
    t.add_argument("--model-type", choices=["unigram", "bpe", "char", "word"], default="unigram")
    t.add_argument("--character-coverage", type=float, default=1.0)
    t.add_argument("--byte-fallback", action="store_true", help="encode unknown characters as bytes")
    t.add_argument("--threads", type=_positive_int, default=1)
    t.add_argument("--overwrite", action="store_true")

    i = sub.add_parser("inspect", help="documents, tokens, dtype and length percentiles of a dataset")
    i.add_argument("prefix", help="dataset prefix (without .bin/.idx)")
    i.add_argument("--json", action="store_true", help="print JSON instead of a table")

    d = sub.add_parser("make-demo-corpus", help="write DIR/corpus.jsonl from Python's own help topics")
    d.add_argument("directory")
    d.add_argument("--min-chars", type=_positive_int, default=1000, help="minimum characters per document")
    d.add_argument("--overwrite", action="store_true")

    q = sub.add_parser("make-demo-sft", help="write DIR/sft.jsonl: questions and answers from Python's help topics")
    q.add_argument("directory")
    q.add_argument("--overwrite", action="store_true")
    return parser


def _run(args: argparse.Namespace) -> int:
    if args.command == "preprocess":
        from .preprocess import preprocess

        preprocess(
            args.input, args.tokenizer_model, args.output_prefix, json_keys=args.json_keys, append_eod=args.append_eod,
            workers=args.workers, strict=args.strict, overwrite=args.overwrite, chunk_lines=args.chunk_lines,
            progress=False if args.no_progress else None,
        )
    elif args.command == "preprocess-sft":
        from .chat import SFTKeys
        from .sft_preprocess import preprocess_sft

        preprocess_sft(
            args.input, args.tokenizer, args.output_prefix,
            keys=SFTKeys(args.messages_key, args.prompt_key, args.response_key, args.system_key),
            seq_length=args.seq_length, drop_long=args.drop_long, add_bos=args.add_bos,
            use_template=not args.builtin_template, workers=args.workers, strict=args.strict,
            overwrite=args.overwrite, chunk_lines=args.chunk_lines, progress=False if args.no_progress else None,
        )
    elif args.command == "train-tokenizer":
        from .tokenizer import train_sentencepiece

        info = train_sentencepiece(
            args.input, args.output, args.vocab_size, json_keys=args.json_keys, model_type=args.model_type,
            character_coverage=args.character_coverage, byte_fallback=args.byte_fallback, threads=args.threads,
            overwrite=args.overwrite,
        )
        print(f"wrote {info['output']}: vocabulary {info['vocab_size']}, trained on {info.get('documents', 0)} "
              f"documents ({info.get('bad_lines', 0)} bad lines skipped)", file=sys.stderr)
    elif args.command == "inspect":
        from .summary import format_summary, summarize

        stats = summarize(args.prefix)
        print(json.dumps(stats, indent=2) if args.json else format_summary(stats))
    elif args.command == "make-demo-corpus":
        from .demo_corpus import make_demo_corpus

        info = make_demo_corpus(args.directory, overwrite=args.overwrite, min_chars=args.min_chars)
        print(f"wrote {info['path']}: {info['documents']} documents, {info['bytes']} bytes", file=sys.stderr)
    elif args.command == "make-demo-sft":
        from .demo_sft import make_demo_sft

        info = make_demo_sft(args.directory, overwrite=args.overwrite)
        print(f"wrote {info['path']}: {info['conversations']} conversations, {info['bytes']} bytes", file=sys.stderr)
    return EXIT_OK


def main(argv: Sequence[str] | None = None, prog: str = "mf-data") -> int:
    parser = build_parser(prog)
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
        return _run(args)
    except _UsageError as err:
        print(str(err), file=sys.stderr)
        return EXIT_BAD_INPUT
    except MFDataError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except FileExistsError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as err:  # disk full, a file gone mid-run...: one line, outputs already rolled back
        where = f"{err.filename}: " if err.filename else ""
        print(f"{prog}: error: {where}{err.strerror or err}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
