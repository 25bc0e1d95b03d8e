"""The `mf` command: parse the sub-command, hand the work to the package that owns it.

Every sub-command lives in `mf_cli.commands.<name>` and exposes `add_parser(subparsers)` and
`run(args) -> int`. Modules are imported lazily so that `mf config ...` never pays for importing
MindSpore. Exit codes: 0 done, 2 bad input (one line on stderr, no traceback), 1 failure at run
time. A refused config prints one `key: reason` line per problem.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys

from mf_cli import __version__
from mf_cli.errors import UsageError

# name -> one-line help. The module `mf_cli.commands.<name>` implements it.
COMMANDS: dict[str, str] = {
    "config": "validate, show or migrate a training YAML (mf config validate|show|migrate ...)",
    "train": "train or fine-tune a model as a YAML describes (mf train CONFIG [--set KEY=VALUE ...])",
    "launch": "mf train on N ranks under msrun (mf launch -n N [--nodes ...] CONFIG [--set KEY=VALUE ...])",
    "eval": "loss, perplexity and token accuracy of a checkpoint on held-out data (mf eval CONFIG), or "
            "lm-evaluation-harness tasks (--tasks)",
    "generate": "generate text from a predict YAML, an mf checkpoint or an HF directory",
    "serve": "serve a model over HTTP with an OpenAI-compatible API (continuous batching)",
    "report": "plot and summarise training runs, compare their losses step by step (mf report RUN_DIR ...)",
    "plan": "the parallel layout, pipeline stages and schedule timeline of a YAML, with its bubble (mf plan CONFIG)",
}

# Sub-commands that hand their whole argument list to another package's own CLI.
DELEGATED: dict[str, str] = {
    "data": "datasets: preprocess, train-tokenizer, inspect, make-demo-corpus (the mf-data CLI)",
    "ckpt": "checkpoints: inspect, verify, merge, convert, merge-lora (the mf-ckpt CLI)",
}


class ArgumentError(Exception):
    """A command line argparse refused: reported as one line, exit 2 (like every bad input)."""

    def __init__(self, prog: str, message: str):
        super().__init__(f"{prog}: error: {message} (see '{prog} --help')")


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is one line (`mf generate: error: ... (see 'mf generate --help')`)
    instead of the usage block; every sub-command's parser is one of these."""

    def error(self, message: str):  # type: ignore[override]
        raise ArgumentError(self.prog, message)


# Options whose value is a list of integers (`--prompt-ids -1,2`): argparse would take a value
# starting with '-' for an option, so such a pair is joined into `--prompt-ids=-1,2` first.
INTEGER_LIST_OPTIONS = ("--prompt-ids",)
_INTEGER_LIST = re.compile(r"-?[0-9]+([,\s]+-?[0-9]+)*[,\s]*")


def _join_integer_lists(argv: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "--":
            return out + argv[i:]
        if argv[i] in INTEGER_LIST_OPTIONS and i + 1 < len(argv) and argv[i + 1].startswith("-") \
                and _INTEGER_LIST.fullmatch(argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mf", description="mf: train, fine-tune, evaluate and serve LLMs on MindSpore.")
    parser.add_argument("--version", action="version", version=f"mf {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, help_text in COMMANDS.items():
        module = importlib.import_module(f"mf_cli.commands.{name}")
        module.add_parser(sub, name, help_text)
    for name, help_text in DELEGATED.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        module = importlib.import_module(f"mf_cli.commands.{argv[0]}")
        return module.run_delegated(argv[1:])
    try:
        args, extra = build_parser().parse_known_args(_join_integer_lists(argv))
        if extra:  # named after the sub-command they were given to, not the top-level `mf`
            prog = " ".join(["mf", args.command] + ([args.action] if getattr(args, "action", None) else []))
            raise ArgumentError(prog, f"unrecognized arguments: {' '.join(extra)}")
    except ArgumentError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        return int(args.run(args) or 0)
    except UsageError as exc:
        # One line per problem (the preflight reports every problem of a config at once).
        for line in str(exc).splitlines() or [""]:
            print(f"mf {args.command}: error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"mf {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
