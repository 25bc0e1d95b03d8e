"""Per-step communication volume: bytes per collective kind, native vs emulated.

Every collective Cell reports each execution through `CountOp`, a MindSpore `Custom` op of type
`pyfunc` marked as having a side effect. That is what makes the counter exact in GRAPH_MODE too:
Python code inside a compiled `construct` or `bprop` runs only while compiling (or is removed as
dead code), but a side-effecting pyfunc op runs every time the graph runs, once per call site, and
is neither merged with an identical call nor pruned from a gradient graph (measured on 2.10.0).

Two figures per record:
- payload bytes: the size of the tensor handed to the logical collective by this rank (what the
  analytic formulas of a strategy count);
- issued bytes: the size of the buffer actually handed to the backend primitive, which is larger
  than the payload when the collective is emulated (e.g. an all-gather emulated by an all-reduce of
  a zero-padded buffer of group-size slots).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import ops
from mindspore.ops.primitive import constexpr


def _probe() -> int:
    return 0


@constexpr(check=False)
def _seen_as_graph(fn) -> bool:
    # Inside a compiled graph a Python function reaches a constexpr as a graph, i.e. None here;
    # run eagerly it is the function itself. (The same test MindSpore uses internally.)
    return fn is None


def _run_in_jit() -> bool:
    """True while MindSpore compiles the caller (GRAPH_MODE, ms.jit), False when it runs eagerly."""
    return _seen_as_graph(_probe)

# code -> (kind, emulated): the int code travels through the pyfunc op as data.
_CODES: list[tuple[str, bool]] = []
_CODES_LOCK = threading.Lock()


def _code_for(kind: str, emulated: bool) -> int:
    with _CODES_LOCK:
        key = (kind, emulated)
        if key not in _CODES:
            _CODES.append(key)
        return _CODES.index(key)


@dataclass
class KindVolume:
    calls: int = 0
    payload_bytes: int = 0
    issued_bytes: int = 0


class CommStats:
    """Accumulates what this rank's collectives moved since the last `reset()`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._volumes: dict[tuple[str, bool], KindVolume] = {}

    def record(self, kind: str, emulated: bool, payload_bytes: int, issued_bytes: int) -> None:
        with self._lock:
            vol = self._volumes.setdefault((kind, emulated), KindVolume())
            vol.calls += 1
            vol.payload_bytes += payload_bytes
            vol.issued_bytes += issued_bytes

    def reset(self) -> None:
        with self._lock:
            self._volumes.clear()

    def snapshot(self) -> dict[str, dict[str, int]]:
        """{"all_gather/emulated": {"calls", "payload_bytes", "issued_bytes"}, ...}, sorted by key."""
        with self._lock:
            items = sorted(self._volumes.items())
        return {f"{kind}/{'emulated' if emulated else 'native'}": vars(vol).copy() for (kind, emulated), vol in items}

    def payload_by_kind(self) -> dict[str, int]:
        """Payload bytes per logical kind, native and emulated together."""
        out: dict[str, int] = {}
        with self._lock:
            for (kind, _), vol in self._volumes.items():
                out[kind] = out.get(kind, 0) + vol.payload_bytes
        return out

    def summary(self) -> str:
        """One line for a step log, e.g. `all_gather/emulated 3x 1.2 MB (issued 2.4 MB)`."""
        parts = []
        for key, vol in self.snapshot().items():
            parts.append(f"{key} {vol['calls']}x {vol['payload_bytes'] / 1e6:.3f} MB"
                         f" (issued {vol['issued_bytes'] / 1e6:.3f} MB)")
        return "; ".join(parts) if parts else "no communication"


_STATS = CommStats()


def comm_stats() -> CommStats:
    """The process-wide counter every collective reports to (read and reset it once per step)."""
    return _STATS


def _count(record: np.ndarray) -> np.ndarray:
    code, payload, issued = (int(v) for v in record)
    kind, emulated = _CODES[code]
    _STATS.record(kind, emulated, payload, issued)
    return record


def _record(code: int, payload: int, issued: int) -> None:
    kind, emulated = _CODES[code]
    _STATS.record(kind, emulated, payload, issued)


def counted(x, count_op, code: int, payload: int, issued: int):
    """Return `x` after reporting one collective: `x` gains a dependency on the counting op when
    compiled; when running eagerly the record is made directly in Python, because the pyfunc op
    costs ~3 ms per call in PyNative (~0.1 ms for a plain op)."""
    if _run_in_jit():
        # The record also depends on x: identical constant inputs let the compiler merge the
        # records of two call sites inside gradient graphs (seen on 2.10.0 despite the side effect).
        record = ops.depend(ms.Tensor([code, payload, issued], ms.int64), x)
        return ops.depend(x, count_op(record))
    _record(code, payload, issued)
    return x


def make_count_op():
    """A side-effecting pyfunc op: `op(Tensor([code, payload, issued], int64))` records one call."""
    from mindspore import ops

    op = ops.Custom(_count, out_shape=lambda s: s, out_dtype=lambda d: d, func_type="pyfunc")
    # Without a side effect the compiler merges identical calls and drops them from grad graphs.
    op.add_prim_attr("side_effect_io", True)
    return op


def count_code(kind: str, emulated: bool) -> int:
    return _code_for(kind, emulated)
