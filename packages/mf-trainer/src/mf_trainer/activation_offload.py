"""Activation offload in PyNative: a Cell's saved activations go to host memory after its forward
and come back for its backward, through `mindspore.saved_tensors_hooks`.

    offload = ActivationOffload(device="Ascend", prefetch=1)
    offload.wrap(model.layers[0], "layers.0")          # the whole block
    offload.wrap(model.layers[1].feed_forward, "layers.1.feed_forward")
    ... train ...; offload.stats.units["layers.0"].bytes_out

A wrapped Cell keeps its class (a dynamic subclass overriding `__call__`, so `isinstance`,
attribute and parameter names are unchanged) and runs each call inside a saved-tensor hook scope:

- pack (forward, once per tensor an operator saves for backward): the tensor is copied to host
  memory (`Tensor.to("CPU", copy=True)`), and the autograd graph keeps the host copy instead. Not
  moved: the Cell's parameters (they stay on the device for the optimizer anyway) and the tensors
  handed to the Cell after its first argument (mf's blocks and modules take the hidden states
  first, then the step's shared inputs: RoPE tables, the attention mask, which the model holds for
  every layer, so moving them would free nothing). A tensor several operators save (the input
  of q, k and v's projections) is copied once: the scope remembers what it packed until the Cell's
  forward ends (the originals are then released; until then the operators hold them anyway).
- unpack (backward): the copy comes back to the device once (`Tensor.to(device)`) and is shared by
  every operator that saved it; and the next `prefetch` saved activations in backward order (the
  ones packed just before it) start their way back without blocking, so the copy overlaps the
  backward of what comes first (`swap.default_prefetch`).

`Cell.recompute()` composes: hooked at `__call__`, the scope also covers the recomputing bprop's
own saved inputs, so a recomputed layer's input (all it keeps) goes to host; the forward that
backward re-runs is outside the scope (its tensors live only inside that backward).

Why `Tensor.to` and not `Tensor.move_to`: MindSpore 2.10 documents `move_to` as deprecated
("removed after 2.9.0"); `to(device, non_blocking, copy)` is its replacement. On CPU the device
is the host: the copy out is a real copy (so the round trip is exercised and tested), the way
back is the same buffer, and `non_blocking` is not used (MindSpore's CPU backend has no
asynchronous copy: it asks for an Ascend context).

The scope is a Python context manager: PyNative only (`saved_tensors_hooks` is not supported in
GRAPH_MODE or inside `jit`); the Trainer trains in PyNative when swap is on (swap.py says why).
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from dataclasses import dataclass, field

import mindspore as ms
from mindspore import nn


@dataclass
class UnitStats:
    """What one wrapped Cell moved, summed over its calls."""

    calls: int = 0
    packed: int = 0          # saved activations copied to host (each distinct tensor once per call)
    bytes_out: int = 0       # their bytes
    repacked: int = 0        # further saves of a tensor already copied in the same call (no copy)
    kept: int = 0            # saves left in place: parameters and the shared inputs


@dataclass
class OffloadStats:
    units: dict[str, UnitStats] = field(default_factory=dict)
    fetched: int = 0         # copies brought back for backward
    bytes_in: int = 0
    prefetched: int = 0      # of those, started ahead of their use

    @property
    def packed(self) -> int:
        return sum(u.packed for u in self.units.values())

    @property
    def bytes_out(self) -> int:
        return sum(u.bytes_out for u in self.units.values())

    def snapshot(self) -> dict:
        return {"units": {k: dict(vars(v)) for k, v in self.units.items()}, "fetched": self.fetched,
                "bytes_in": self.bytes_in, "prefetched": self.prefetched}


class _Saved:
    """What the autograd graph holds instead of an offloaded tensor."""

    __slots__ = ("host", "device", "nbytes", "order", "__weakref__")

    def __init__(self, host, nbytes: int, order: int) -> None:
        self.host, self.device, self.nbytes, self.order = host, None, nbytes, order


def _key(t) -> tuple:
    # The same storage seen through another view (a transpose, a reshape) is another tensor to
    # backward: the key is the view, not the buffer.
    return t.data_ptr(), tuple(t.shape), t.dtype, tuple(t.stride())


class ActivationOffload:
    """`device`: MindSpore's device name the activations live on ("Ascend", "CPU"); `prefetch`:
    saved activations whose copy back starts ahead of their use (>= 1)."""

    def __init__(self, device: str, prefetch: int = 1) -> None:
        self.device = device
        self.prefetch = prefetch
        self.stats = OffloadStats()
        self._order = itertools.count()
        # order -> not yet fetched copies, in pack order; entries vanish with their copies.
        self._waiting: weakref.WeakValueDictionary[int, _Saved] = weakref.WeakValueDictionary()

    # ---- wrapping -------------------------------------------------------------------------
    def wrap(self, cell: nn.Cell, unit: str) -> None:
        """Offload what `cell` saves for backward, counted under `unit` (e.g. "layers.0")."""
        base = type(cell)
        base_call = base.__call__
        offload = self
        self.stats.units.setdefault(unit, UnitStats())

        def __call__(self, *args, **kwargs):
            with offload.scope(self, unit, args[1:] + tuple(kwargs.values())):
                return base_call(self, *args, **kwargs)

        cell.__class__ = type(f"Offloaded{base.__name__}", (base,), {"__call__": __call__, "offload_unit": unit})

    @contextlib.contextmanager
    def scope(self, cell: nn.Cell, unit: str, shared_inputs=()):
        stats = self.stats.units.setdefault(unit, UnitStats())
        stats.calls += 1
        kept = {p.data_ptr() for p in cell.get_parameters()}
        kept.update(x.data_ptr() for x in shared_inputs if isinstance(x, ms.Tensor))
        packed: dict[tuple, tuple] = {}    # key -> (original, its _Saved): one copy per tensor and call

        def pack(t):
            if t.data_ptr() in kept:
                stats.kept += 1
                return t
            key = _key(t)
            if key in packed:
                stats.repacked += 1
                return packed[key][1]
            saved = _Saved(t.to("CPU", copy=True), t.nbytes, next(self._order))
            packed[key] = (t, saved)
            self._waiting[saved.order] = saved
            stats.packed += 1
            stats.bytes_out += saved.nbytes
            return saved

        try:
            with ms.saved_tensors_hooks(pack, self._unpack):
                yield
        finally:
            packed.clear()       # the device originals may go now: the graph holds the host copies

    # ---- backward ---------------------------------------------------------------------------
    def _fetch(self, saved: _Saved, ahead: bool) -> None:
        if saved.device is not None:
            return
        if self.device == "CPU":
            saved.device = saved.host.to("CPU")       # the host is the device: the same buffer
        else:
            saved.device = saved.host.to(self.device, non_blocking=ahead)
        self._waiting.pop(saved.order, None)
        self.stats.fetched += 1
        self.stats.bytes_in += saved.nbytes
        self.stats.prefetched += int(ahead)

    def _unpack(self, saved):
        if not isinstance(saved, _Saved):
            return saved            # a parameter or shared input, left in place
        self._fetch(saved, ahead=False)
        # Backward runs roughly in reverse pack order: start the copies of the ones packed before.
        for order in range(saved.order - 1, saved.order - 1 - self.prefetch, -1):
            waiting = self._waiting.get(order)
            if waiting is not None:
                self._fetch(waiting, ahead=True)
        return saved.device
