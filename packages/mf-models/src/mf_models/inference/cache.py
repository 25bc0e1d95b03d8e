"""A KV cache of fixed slots, each holding one sequence at its own position, for continuous batching.

`SlotKVCache` owns the buffers: per layer, keys [slots * kv_heads * max_len, d_k] and values
[slots * kv_heads * max_len, d_v], one row per (slot, head, position): row
`(slot * heads + h) * max_len + p` holds head h of slot `slot`'s key at position p (the layout
[slots, heads, max_len, d] attention reads, flattened). Slot n holds one request's keys at positions 0..len_n - 1; the
slots are independent, so a request can join (prefill into a free slot) or leave between two decode
steps without touching the others.

Why flat rows: a step writes its new rows with `ScatterUpdate`, which updates the buffer in place,
and reads the positions it attends over with one `Gather` of exactly those rows, already in
attention's [rows, heads, positions, d] order. Both cost what they touch. (`ScatterNdUpdate` on a [slots, heads, max_len, d] buffer, the first layout, copies
the whole buffer on every call on CPU: 16 slots x 2048 positions of the 20M llama made a decode step
2.4x slower than 144 positions.)

The model sees a *view* through the cache protocol `CausalLM.construct` already speaks
(`begin(seq)`, `causal_mask(query_positions, attention_mask)`, `update(layer_id, k, v)`; see
`mf_models.KVCache`), so model.py knows nothing of slots:

- `PrefillView`: `rows` new sequences (default one), padded to a bucket length Pb, for the slots in
  `slot` [rows] (a slot may repeat, with the same sequence: the same rows are written twice).
  Attention runs over the prompt's own keys (causal); the keys are then written to the slot's
  rows 0..Pb-1 (anything past the prompt is stale and never visible: a query at position p only
  sees keys at positions <= p, written by then).
- `DecodeView`: one token for each of the first `rows` slots at its own position `positions`
  [rows]: each slot's new key is written to (slot, position), and attention reads the first
  `view_len` positions of those slots, masked per slot to the keys at positions <= its own. One
  view per (rows, length) bucket: short sequences do not pay for attending over the whole buffer,
  and a few requests do not pay for every slot (the scheduler seats requests in the lowest free
  slots, so the occupied ones are a prefix, give or take the holes finished requests leave).

A view's per-call inputs (slot, positions) live in small Parameters that the step Cell assigns
before it calls the model (`set_inputs`): a Parameter is the way to hand a value to a Cell method
the model calls, the same in PyNative and in GRAPH_MODE (auto-monad orders the write before the
reads). Views share the storage's Parameters, so every compiled step sees the same buffers.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops


class SlotKVCache:
    """Buffers of `slots` sequences of at most `max_len` positions for every layer."""

    def __init__(self, num_layers: int, slots: int, max_len: int, k_shape: tuple[int, int],
                 v_shape: tuple[int, int], dtype: ms.Type = ms.float32):
        self.num_layers, self.slots, self.max_len, self.dtype = num_layers, slots, max_len, dtype
        self.k_shape, self.v_shape = tuple(k_shape), tuple(v_shape)

        def buffers(kind: str, heads: int, dim: int) -> ms.ParameterTuple:
            return ms.ParameterTuple(
                Parameter(Tensor(np.zeros((slots * heads * max_len, dim), np.float32), dtype),
                          name=f"slot_cache.{kind}{i}", requires_grad=False) for i in range(num_layers))

        self.keys = buffers("k", *self.k_shape)
        self.values = buffers("v", *self.v_shape)

    @classmethod
    def for_model(cls, model, slots: int, max_len: int) -> SlotKVCache:
        k_shape, v_shape = model.kv_cache_shapes()
        return cls(len(model.layers), slots, max_len, k_shape, v_shape, model.compute_dtype)

    def nbytes(self) -> int:
        per_position = self.k_shape[0] * self.k_shape[1] + self.v_shape[0] * self.v_shape[1]
        itemsize = 2 if self.dtype in (ms.float16, ms.bfloat16) else 4
        return self.num_layers * self.slots * self.max_len * per_position * itemsize


# In-place row writes (the functional ops.scatter_update builds the same primitive per call).
_write_rows = ops.ScatterUpdate()


def _row_starts(slots: int, heads: int, max_len: int) -> np.ndarray:
    """[slots, heads] int32: the row of (slot, head, position 0)."""
    return (np.arange(slots * heads, dtype=np.int32) * max_len).reshape(slots, heads)


class PrefillView(nn.Cell):
    """Cache protocol for prefilling `rows` sequences of `seq_len` (a bucket) into the slots `slot`."""

    def __init__(self, storage: SlotKVCache, seq_len: int, rows: int = 1):
        super().__init__(auto_prefix=False)
        if seq_len > storage.max_len:
            raise ValueError(f"prefill bucket {seq_len} exceeds the cache length {storage.max_len}")
        self.keys, self.values = storage.keys, storage.values
        self.seq_len = seq_len
        self.slot = Parameter(Tensor(np.zeros((rows,), np.int32)), name=f"prefill{rows}x{seq_len}.slot",
                              requires_grad=False)
        self.positions = Tensor(np.arange(seq_len, dtype=np.int32).reshape(1, seq_len))
        # rows of slot 0, heads x positions; a slot's are these plus slot * heads * max_len
        self.k_rows = Tensor((_row_starts(1, storage.k_shape[0], storage.max_len)[0, :, None]
                              + np.arange(seq_len, dtype=np.int32)).reshape(-1))
        self.v_rows = Tensor((_row_starts(1, storage.v_shape[0], storage.max_len)[0, :, None]
                              + np.arange(seq_len, dtype=np.int32)).reshape(-1))
        self.k_slot_rows, self.v_slot_rows = storage.k_shape[0] * storage.max_len, storage.v_shape[0] * storage.max_len

    def set_inputs(self, slot):
        return ops.assign(self.slot, slot)

    def begin(self, seq: int):
        return self.positions

    def causal_mask(self, query_positions, attention_mask=None):
        mask = query_positions.reshape(1, 1, 1, -1) > query_positions.reshape(1, 1, -1, 1)
        if attention_mask is not None:
            mask = ops.logical_or(mask, attention_mask.astype(ms.bool_))
        return mask

    def update(self, layer_id: int, k, v):
        keys, values = self.keys[layer_id], self.values[layer_id]
        slot = self.slot.reshape(-1, 1)                                      # row r: slot[r]'s rows
        _write_rows(keys, (self.k_rows + slot * self.k_slot_rows).reshape(-1), k.reshape(-1, k.shape[-1]).astype(keys.dtype))
        _write_rows(values, (self.v_rows + slot * self.v_slot_rows).reshape(-1),
                    v.reshape(-1, v.shape[-1]).astype(values.dtype))
        return k, v  # a fresh slot: the prompt attends to its own keys only


class DecodeView(nn.Cell):
    """Cache protocol for one decode token in each of the first `rows` slots (default: every slot),
    attending over the first `view_len` positions."""

    def __init__(self, storage: SlotKVCache, view_len: int, rows: int | None = None):
        super().__init__(auto_prefix=False)
        rows = storage.slots if rows is None else rows
        if view_len > storage.max_len:
            raise ValueError(f"decode bucket {view_len} exceeds the cache length {storage.max_len}")
        if not 1 <= rows <= storage.slots:
            raise ValueError(f"decode rows {rows} outside 1..{storage.slots} slots")
        self.keys, self.values = storage.keys, storage.values
        self.rows, self.view_len = rows, view_len
        self.positions = Parameter(Tensor(np.zeros((rows,), np.int32)), name=f"decode{rows}x{view_len}.positions",
                                   requires_grad=False)
        self.key_positions = Tensor(np.arange(view_len, dtype=np.int32).reshape(1, 1, 1, view_len))
        span = np.arange(view_len, dtype=np.int32)
        k_starts = _row_starts(rows, storage.k_shape[0], storage.max_len)
        v_starts = _row_starts(rows, storage.v_shape[0], storage.max_len)
        self.k_starts, self.v_starts = Tensor(k_starts), Tensor(v_starts)                 # [rows, heads]
        self.k_view = Tensor((k_starts[..., None] + span).reshape(-1))     # rows x heads x view_len
        self.v_view = Tensor((v_starts[..., None] + span).reshape(-1))

    def set_inputs(self, positions):
        return ops.assign(self.positions, positions)

    def begin(self, seq: int):
        return self.positions.reshape(-1, 1)

    def causal_mask(self, query_positions, attention_mask=None):
        mask = self.key_positions > query_positions.reshape(-1, 1, 1, 1)   # [rows, 1, 1, view_len]
        if attention_mask is not None:
            mask = ops.logical_or(mask, attention_mask.astype(ms.bool_))
        return mask

    def _step(self, buffer, starts, view, x):
        """Write x [rows, heads, 1, d] at each slot's position; the slots' first view_len positions
        [rows, heads, view_len, d] (the new key among them) come back."""
        rows, heads, _, dim = x.shape
        where = (starts + self.positions.reshape(-1, 1)).reshape(-1)              # [rows * heads]
        written = _write_rows(buffer, where, x.reshape(rows * heads, dim).astype(buffer.dtype))
        seen = ops.gather(ops.depend(buffer, written), view, 0)                   # after the write
        return seen.reshape(rows, heads, self.view_len, dim)

    def update(self, layer_id: int, k, v):
        return (self._step(self.keys[layer_id], self.k_starts, self.k_view, k),
                self._step(self.values[layer_id], self.v_starts, self.v_view, v))
