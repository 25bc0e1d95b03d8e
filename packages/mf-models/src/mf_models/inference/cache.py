"""A KV cache of fixed slots, each holding one sequence at its own position, for continuous batching.

`SlotKVCache` owns the buffers: per layer, keys [slots, kv_heads, max_len, d_k] and values
[slots, kv_heads, max_len, d_v]. Slot n holds one request's keys at positions 0..len_n - 1; the
slots are independent, so a request can join (prefill into a free slot) or leave between two decode
steps without touching the others.

The model sees a *view* through the cache protocol `CausalLM.construct` already speaks
(`begin(seq)`, `causal_mask(query_positions, attention_mask)`, `update(layer_id, k, v)`; see
`mf_models.KVCache`), so model.py knows nothing of slots:

- `PrefillView`: one new sequence, padded to a bucket length Pb, for the slot in `slot` [1].
  Attention runs over the prompt's own keys (causal); the keys are then written as the slot's
  whole row (positions >= Pb zeroed, anything past the prompt is stale and never visible: a
  query at position p only sees keys at positions <= p, written by then).
- `DecodeView`: one token for every slot at its own position `positions` [slots]: each slot's new
  key is scattered to (slot, position), and attention reads the first `view_len` positions of
  every slot, masked per slot to the keys at positions <= its own. One view per length bucket:
  short sequences do not pay for attending over the whole buffer.

A view's per-call inputs (slot, positions) live in small Parameters that the step Cell assigns
before it calls the model (`set_inputs`): a Parameter is the way to hand a value to a Cell method
the model calls, the same in PyNative and in GRAPH_MODE (auto-monad orders the write before the
reads). Views share the storage's Parameters, so every compiled step sees the same buffers.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, mint, nn, ops


class SlotKVCache:
    """Buffers of `slots` sequences of at most `max_len` positions for every layer."""

    def __init__(self, num_layers: int, slots: int, max_len: int, k_shape: tuple[int, int],
                 v_shape: tuple[int, int], dtype: ms.Type = ms.float32):
        self.num_layers, self.slots, self.max_len, self.dtype = num_layers, slots, max_len, dtype
        self.k_shape, self.v_shape = tuple(k_shape), tuple(v_shape)

        def buffers(kind: str, heads: int, dim: int) -> ms.ParameterTuple:
            return ms.ParameterTuple(
                Parameter(Tensor(np.zeros((slots, heads, max_len, dim), np.float32), dtype),
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


class PrefillView(nn.Cell):
    """Cache protocol for prefilling one sequence of `seq_len` (a bucket) into slot `slot`."""

    def __init__(self, storage: SlotKVCache, seq_len: int):
        super().__init__(auto_prefix=False)
        if seq_len > storage.max_len:
            raise ValueError(f"prefill bucket {seq_len} exceeds the cache length {storage.max_len}")
        self.keys, self.values = storage.keys, storage.values
        self.max_len = storage.max_len
        self.seq_len = seq_len
        self.slot = Parameter(Tensor(np.zeros((1,), np.int32)), name=f"prefill{seq_len}.slot", requires_grad=False)
        self.positions = Tensor(np.arange(seq_len, dtype=np.int32).reshape(1, seq_len))

    def set_inputs(self, slot):
        return ops.assign(self.slot, slot)

    def begin(self, seq: int):
        return self.positions

    def causal_mask(self, query_positions, attention_mask=None):
        mask = query_positions.reshape(1, 1, 1, -1) > query_positions.reshape(1, 1, -1, 1)
        if attention_mask is not None:
            mask = ops.logical_or(mask, attention_mask.astype(ms.bool_))
        return mask

    def _write_row(self, buffer, x):
        b, heads, seq, dim = x.shape
        if seq < self.max_len:
            x = mint.cat((x, ops.zeros((b, heads, self.max_len - seq, dim), x.dtype)), 2)
        return ops.scatter_update(buffer, self.slot, x.astype(buffer.dtype))

    def update(self, layer_id: int, k, v):
        self._write_row(self.keys[layer_id], k)
        self._write_row(self.values[layer_id], v)
        return k, v  # a fresh slot: the prompt attends to its own keys only


class DecodeView(nn.Cell):
    """Cache protocol for one decode token per slot, attending over the first `view_len` positions."""

    def __init__(self, storage: SlotKVCache, view_len: int):
        super().__init__(auto_prefix=False)
        if view_len > storage.max_len:
            raise ValueError(f"decode bucket {view_len} exceeds the cache length {storage.max_len}")
        self.keys, self.values = storage.keys, storage.values
        self.slots, self.view_len, self.full = storage.slots, view_len, view_len == storage.max_len
        self.positions = Parameter(Tensor(np.zeros((storage.slots,), np.int32)), name=f"decode{view_len}.positions",
                                   requires_grad=False)
        self.key_positions = Tensor(np.arange(view_len, dtype=np.int32).reshape(1, 1, 1, view_len))
        k_heads, v_heads = storage.k_shape[0], storage.v_shape[0]
        # (slot, head) pairs of the scatter indices; the position column is added per call
        self.k_rows = Tensor(np.stack(np.meshgrid(np.arange(storage.slots), np.arange(k_heads), indexing="ij"), -1)
                             .reshape(-1, 2).astype(np.int32))
        self.v_rows = Tensor(np.stack(np.meshgrid(np.arange(storage.slots), np.arange(v_heads), indexing="ij"), -1)
                             .reshape(-1, 2).astype(np.int32))

    def set_inputs(self, positions):
        return ops.assign(self.positions, positions)

    def begin(self, seq: int):
        return self.positions.reshape(-1, 1)

    def causal_mask(self, query_positions, attention_mask=None):
        mask = self.key_positions > query_positions.reshape(-1, 1, 1, 1)   # [slots, 1, 1, view_len]
        if attention_mask is not None:
            mask = ops.logical_or(mask, attention_mask.astype(ms.bool_))
        return mask

    def _scatter(self, buffer, rows, x):
        slots, heads, _, dim = x.shape
        where = ops.repeat_elements(self.positions.reshape(-1, 1), heads, 0)    # [slots * heads, 1]
        indices = mint.cat((rows, where), 1)
        updated = ops.scatter_nd_update(buffer, indices, x.reshape(slots * heads, dim).astype(buffer.dtype))
        return updated if self.full else updated[:, :, :self.view_len]

    def update(self, layer_id: int, k, v):
        return self._scatter(self.keys[layer_id], self.k_rows, k), self._scatter(self.values[layer_id], self.v_rows, v)
