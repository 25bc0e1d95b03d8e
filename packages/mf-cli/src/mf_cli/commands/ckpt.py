"""`mf ckpt ...` is `mf-ckpt ...`: inspect, verify, merge and convert checkpoints."""

from __future__ import annotations


def run_delegated(argv: list[str]) -> int:
    from mf_ckpt.cli import main

    return int(main(argv, prog="mf ckpt") or 0)
