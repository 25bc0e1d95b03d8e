"""Whether a parallel layout can split a model: pure arithmetic on the model's arguments.

Free of MindSpore on purpose: the trainer's preflight (`mf config validate`, `mf launch` before
msrun starts) asks these questions from a YAML alone, and each model's `parallelize.py` asks the
same ones before it changes the model, so the two can never disagree.
"""

from __future__ import annotations

import math


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def divisible_problems(tp: int, **sizes: int) -> list[str]:
    """One line per model key whose dimension tensor_parallel does not divide."""
    out = []
    for key, value in sizes.items():
        if value % tp:
            options = [d for d in range(1, min(value, 64) + 1) if value % d == 0]
            out.append(f"parallelism.tensor_parallel: {tp} does not divide model.{key} = {value}; "
                       f"use a tensor_parallel that divides it (e.g. one of {options})")
    return out


def head_problems(tp: int, world_size: int, num_heads: int, num_kv_heads: int | None = None) -> list[str]:
    """One line per head count tensor_parallel does not divide (mf_parallel.ParallelDims.check_heads'
    wording; the suggested degrees are the ones that also divide the world)."""
    kv = num_heads if num_kv_heads is None else num_kv_heads
    out = []
    for label, count in (("num_attention_heads", num_heads), ("num_key_value_heads", kv)):
        if count % tp:
            options = [d for d in _divisors(math.gcd(num_heads, kv)) if world_size % d == 0]
            out.append(f"parallelism.tensor_parallel: {tp} does not divide model.{label} = {count}; use a "
                       f"tensor_parallel that divides both head counts: one of {options}")
    return out


def tensor_parallel_problems(args, tp: int, world_size: int) -> list[str]:
    """Every reason `tp`-way tensor parallelism cannot split the model of `args` (empty: it can).
    What is split comes from the args class (`tensor_parallel_split`)."""
    if tp <= 1:
        return []
    heads, sizes = args.tensor_parallel_split()
    problems = [*head_problems(tp, world_size, *heads), *divisible_problems(tp, **sizes)]
    return problems
