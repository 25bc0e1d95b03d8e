"""`mf data ...` is `mf-data ...`: preprocess, train-tokenizer, inspect, make-demo-corpus."""

from __future__ import annotations


def run_delegated(argv: list[str]) -> int:
    from mf_data.cli import main

    return int(main(argv, prog="mf data") or 0)
