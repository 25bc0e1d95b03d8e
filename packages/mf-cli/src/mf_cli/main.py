"""The `mf` command: parse the sub-command, hand the work to the package that owns it.

Every sub-command lives in `mf_cli.commands.<name>` and exposes `add_parser(subparsers)` and
`run(args) -> int`. Modules are imported lazily so that `mf config ...` never pays for importing
MindSpore. Exit codes: 0 done, 2 bad input (one line on stderr, no traceback), 1 failure at run
time.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from mf_cli import __version__
from mf_cli.errors import UsageError

# name -> one-line help. The module `mf_cli.commands.<name>` implements it.
COMMANDS: dict[str, str] = {
    "config": "validate, show or migrate a training YAML (mf config validate|show|migrate ...)",
    "train": "train or fine-tune a model as a YAML describes (mf train CONFIG [--set KEY=VALUE ...])",
    "launch": "mf train on N ranks under msrun (mf launch -n N [--nodes ...] CONFIG [--set KEY=VALUE ...])",
    "eval": "loss, perplexity and token accuracy of a checkpoint on held-out data (mf eval CONFIG)",
    "generate": "generate text from a predict YAML, an mf checkpoint or an HF directory",
    "serve": "serve a model over HTTP with an OpenAI-compatible API (continuous batching)",
    "plan": "the parallel layout, pipeline stages and schedule timeline of a YAML, with its bubble (mf plan CONFIG)",
}

# Sub-commands that hand their whole argument list to another package's own CLI.
DELEGATED: dict[str, str] = {
    "data": "datasets: preprocess, train-tokenizer, inspect, make-demo-corpus (the mf-data CLI)",
    "ckpt": "checkpoints: inspect, verify, merge, convert, merge-lora (the mf-ckpt CLI)",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mf", description="mf: train, fine-tune, evaluate and serve LLMs on MindSpore.")
    parser.add_argument("--version", action="version", version=f"mf {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
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
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except UsageError as exc:
        print(f"mf {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"mf {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
