"""Small shared pieces: the split enum, weight normalisation, split strings and blend lists.

These follow Megatron-Core's `megatron.core.datasets.utils` and
`blended_megatron_dataset_config` semantics exactly where the input is valid (the split matrix
must be bit-identical, since document ranges are derived from it), and reject input Megatron
would silently mis-read (a negative split such as "-1" parses there as "1").
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from enum import Enum

import numpy as np

from .errors import DatasetConfigError


class Split(Enum):
    train = 0
    valid = 1
    test = 2


def as_split(value: Split | str | int) -> Split:
    """Accept `Split.valid`, `"valid"` or `1`."""
    if isinstance(value, Split):
        return value
    if isinstance(value, str) and value in Split.__members__:
        return Split[value]
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(Split):
        return Split(value)
    raise DatasetConfigError(f"split must be one of train/valid/test, got {value!r}")


def normalize(weights: Sequence[float]) -> list[float]:
    """Divide by the sum in float64, as Megatron does (the exact bits matter downstream)."""
    w = np.array(weights, dtype=np.float64)
    return (w / np.sum(w)).tolist()


_SPLIT_ALLOWED = re.compile(r"^[\s0-9.,/]*$")


def parse_and_normalize_split(split: str) -> list[float]:
    """`"969,30,1"` -> `[0.969, 0.03, 0.001]`; missing trailing entries are 0."""
    if not isinstance(split, str):
        raise DatasetConfigError(f"split must be a string like '969,30,1', got {split!r}")
    if not _SPLIT_ALLOWED.match(split):
        raise DatasetConfigError(
            f"split {split!r}: only non-negative numbers separated by commas are allowed"
        )
    parts = re.findall(r"[.0-9]+", split)
    try:
        vector = [float(p) for p in parts]
    except ValueError:
        raise DatasetConfigError(f"split {split!r}: cannot parse {parts}") from None
    if len(vector) > len(Split):
        raise DatasetConfigError(f"split {split!r}: at most {len(Split)} parts (train, valid, test)")
    vector += [0.0] * (len(Split) - len(vector))
    if not all(math.isfinite(v) for v in vector) or sum(vector) <= 0:
        raise DatasetConfigError(f"split {split!r}: the parts must be finite and sum to more than 0")
    return normalize(vector)


def convert_split_vector_to_split_matrix(
    vector_a: Sequence[float], vector_b: Sequence[float] | None = None
) -> list[tuple[float, float] | None]:
    """Book-ends per split: `[0.99, 0.01, 0.0] -> [(0, 0.99), (0.99, 1.0), None]`.

    The running sums are accumulated left to right in Python floats, as Megatron does, so the
    bounds (and therefore the document ranges, after rounding) are identical.
    """
    if vector_b is None:
        vector_b = vector_a

    def bookends(vector: Sequence[float]) -> list[tuple[float, float]]:
        edges = [0]
        for v in vector:
            edges.append(edges[-1] + v)
        return list(zip(edges[:-1], edges[1:]))

    matrix: list[tuple[float, float] | None] = []
    for a, b in zip(bookends(vector_a), bookends(vector_b)):
        lo, hi = max(a[0], b[0]), min(a[1], b[1])
        matrix.append(None if hi <= lo else (lo, hi))
    return matrix


def get_blend_from_list(
    blend: Sequence[str | float | int] | None,
) -> tuple[list[str], list[float] | None] | None:
    """`["30", "a", "70", "b"]` -> `(["a", "b"], [30.0, 70.0])`; `["a", "b", "c"]` -> prefixes only.

    An even-length list whose every other entry parses as a number is a weighted blend (as in
    Megatron); a list where only some of those entries parse is rejected instead of guessed.
    """
    if blend is None:
        return None
    if isinstance(blend, (str, bytes)):
        blend = [blend]
    items = list(blend)
    if not items:
        raise DatasetConfigError("data_path is empty: give [prefix, ...] or [weight, prefix, ...]")
    if len(items) % 2 == 1:
        return [_prefix(p) for p in items], None
    raw_weights, raw_prefixes = items[0::2], items[1::2]
    weights: list[float | None] = []
    for w in raw_weights:
        try:
            weights.append(float(w))
        except (TypeError, ValueError):
            weights.append(None)
    if all(w is None for w in weights):
        return [_prefix(p) for p in items], None
    if any(w is None for w in weights):
        bad = [raw_weights[i] for i, w in enumerate(weights) if w is None]
        raise DatasetConfigError(
            f"data_path mixes weights and prefixes: {bad!r} in a weight position is not a number"
        )
    return [_prefix(p) for p in raw_prefixes], [float(w) for w in weights]  # type: ignore[arg-type]


def _prefix(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise DatasetConfigError(f"data_path: a dataset prefix must be a non-empty string, got {value!r}")
    return value.strip()


def check_weights(prefixes: Sequence[str], weights: Sequence[float] | None, where: str = "blend") -> None:
    """Weights must be finite and > 0 (Megatron asserts, or divides by zero, otherwise)."""
    if weights is None:
        return
    if len(weights) != len(prefixes):
        raise DatasetConfigError(
            f"{where}: {len(prefixes)} prefixes but {len(weights)} weights; they must pair up"
        )
    for prefix, w in zip(prefixes, weights):
        if isinstance(w, bool) or not isinstance(w, (int, float)):
            raise DatasetConfigError(f"{where}: weight of {prefix!r} must be a number, got {w!r}")
        if not math.isfinite(w) or w <= 0:
            raise DatasetConfigError(f"{where}: weight of {prefix!r} must be finite and > 0, got {w!r}")
