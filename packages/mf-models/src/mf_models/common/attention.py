"""Causal attention core (plain math or Ascend's fused kernel), the causal mask, and the KV cache.

Mask convention (Megatron): boolean, True = masked out, shape broadcastable to [B, 1, S, T].
A user mask (e.g. reset_attention_mask for packed documents, or left padding in generation) is
OR-ed with the causal mask, so it can only hide positions, never reveal future ones.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, mint, nn, ops

from .layers import device_target
from .logs import log_once

# Finite "minus infinity": a fully masked row (a left-padding query) gives a uniform softmax, as in
# HF, instead of NaN.
_MASK_VALUE = -3.4028234663852886e38


def causal_mask(q_len: int, kv_len: int, attention_mask=None):
    """[1|B, 1, q_len, kv_len] bool, True where query i (at absolute kv_len - q_len + i) may not look."""
    offset = kv_len - q_len
    mask = ops.triu(ops.ones((q_len, kv_len), ms.bool_), 1 + offset).reshape(1, 1, q_len, kv_len)
    if attention_mask is not None:
        mask = ops.logical_or(mask, attention_mask.astype(ms.bool_))
    return mask


def repeat_kv(x, n_rep: int):
    """[B, nKV, T, d] -> [B, nKV * n_rep, T, d] (each kv head serves n_rep query heads)."""
    if n_rep == 1:
        return x
    b, n_kv, t, d = x.shape
    return ops.broadcast_to(ops.expand_dims(x, 2), (b, n_kv, n_rep, t, d)).reshape(b, n_kv * n_rep, t, d)


_SUM_LAST = ops.ReduceSum(keep_dims=True)


class LastAxisSoftmax(nn.Cell):
    """softmax over the last axis, its gradient (dout - sum(dout * p)) * p written with an explicit
    broadcast. MindSpore's own softmax gradient subtracts the [.., 1] sum by broadcasting, and
    MindSpore 2.10's CPU kernel for a broadcasting Sub/Add/RealDiv keeps ~4x its output of memory
    of its own for the life of the graph (benchmarks/README.md, "Memory"): 32 MiB a layer at the
    60M llama's batch of 4. Same values: the same kernels on the same operands."""

    def construct(self, x):
        return ops.softmax(x, -1)

    def bprop(self, x, out, dout):
        return ((dout - ops.broadcast_to(_SUM_LAST(dout * out, -1), out.shape)) * out,)


class CoreAttention(nn.Cell):
    """softmax(q k^T * scale + mask) v for q [B, nH, S, d], k [B, nKV, T, d], v [B, nKV, T, dv].

    The head counts come from the tensors, so a tensor-parallel plan that shards heads needs no
    change here; a context-parallel plan can replace this sub-cell as a whole.
    """

    def __init__(self, scale: float, use_flash_attention: bool = False, compute_dtype: ms.Type = ms.float32):
        super().__init__()
        self.scale = scale
        self.matmul_qk = ops.BatchMatMul(transpose_b=True)
        self.matmul_pv = ops.BatchMatMul()
        self.softmax = LastAxisSoftmax()
        self.use_flash = False
        if use_flash_attention:
            if device_target() != "Ascend":
                log_once(f"use_flash_attention: the fused kernel exists only on Ascend; "
                         f"using the plain attention path on {device_target()}")
            elif compute_dtype == ms.float32:
                log_once("use_flash_attention: the fused kernel takes float16/bfloat16 only; "
                         "using the plain attention path for compute_dtype float32")
            else:
                self.use_flash = True

    def construct(self, q, k, v, mask):
        if self.use_flash:
            return self._flash(q, k, v, mask)
        n_rep = q.shape[1] // k.shape[1]
        k = repeat_kv(k, n_rep)
        v = repeat_kv(v, n_rep)
        scores = self.matmul_qk(q, k).astype(ms.float32) * self.scale
        # Adding -FLT_MAX where masked is masked_fill's forward bit for bit (a score plus -FLT_MAX
        # rounds to -FLT_MAX; plus -0.0 is the score) at a fraction of the cost on CPU: MaskedFill
        # over the [B, H, S, T] scores was 30 ms of a 20M llama's step. Only a row with every key
        # masked differs in backward (its uniform probabilities pass gradient, as in HF's eager
        # attention, which adds its mask too). The mask is broadcast over batch and heads
        # explicitly (layers._broadcast_to: the memory of MindSpore's CPU broadcasting kernels).
        scores = scores + ops.broadcast_to(ops.cast(mask, ms.float32) * _MASK_VALUE, scores.shape)
        probs = self.softmax(scores).astype(v.dtype)
        return self.matmul_pv(probs, v)

    def _flash(self, q, k, v, mask):
        b, heads, s, d = q.shape
        dv = v.shape[-1]
        if dv != d:  # MLA: the kernel wants one head size; pad v and cut the output back
            v = mint.cat((v, ops.zeros(v.shape[:-1] + (d - dv,), v.dtype)), -1)
        full_mask = ops.broadcast_to(mask, (b, 1, s, k.shape[2])).astype(ms.uint8)
        out = ops.flash_attention_score(q, k, v, heads, attn_mask=full_mask, scalar_value=self.scale,
                                        input_layout="BNSD")
        return out[..., :dv] if dv != d else out


class KVCache(nn.Cell):
    """Keys and values of every layer in fixed buffers [B, heads, max_len, d], for generation.

    A Cell passed as the model's `cache` argument: its buffers are Parameters updated with
    `ops.assign`, so the same code runs eagerly (PyNative) and compiled (GRAPH_MODE), where every
    decode step has identical shapes and reuses one compiled graph. New keys are written through a
    one-hot [max_len, S] selection matmul (exact: ones and zeros) at slots `length .. length+S-1`;
    keys at slots >= a query's own slot are masked by `causal_mask`, so stale or empty slots
    never leak. The buffers are not parameters of the model (nothing reaches model_state).
    """

    def __init__(self, num_layers: int, batch: int, max_len: int, k_shape: tuple[int, int],
                 v_shape: tuple[int, int], dtype: ms.Type = ms.float32):
        super().__init__()
        self.max_len = max_len

        def buffers(kind: str, heads: int, dim: int):
            return ms.ParameterTuple(
                Parameter(Tensor(np.zeros((batch, heads, max_len, dim), np.float32), dtype),
                          name=f"{kind}{i}", requires_grad=False) for i in range(num_layers))

        self.keys = buffers("k", *k_shape)
        self.values = buffers("v", *v_shape)
        self.length = Parameter(Tensor(0, ms.int32), name="length", requires_grad=False)
        self.slots = Tensor(np.arange(max_len), ms.int32)

    def reset(self) -> None:
        self.length.set_data(Tensor(0, ms.int32))

    def begin(self, seq: int):
        """Claim the next `seq` slots; returns their indices [S] (int32)."""
        positions = self.length + ops.arange(0, seq, dtype=ms.int32)
        ops.assign(self.length, self.length + seq)
        return positions

    def causal_mask(self, query_slots, attention_mask=None):
        """[1|B, 1, S, max_len] bool: True where the key slot is after the query's own slot."""
        mask = self.slots.reshape(1, 1, 1, -1) > query_slots.reshape(1, 1, -1, 1)
        if attention_mask is not None:
            mask = ops.logical_or(mask, attention_mask.astype(ms.bool_))
        return mask

    def update(self, layer_id: int, k, v):
        """Write k/v [B, heads, S, d] into the slots claimed by `begin`; returns the full buffers."""
        seq = k.shape[2]
        query_slots = self.length - seq + ops.arange(0, seq, dtype=ms.int32)
        select = (self.slots.reshape(-1, 1) == query_slots.reshape(1, -1)).astype(k.dtype)  # [max_len, S]
        keep = 1 - select.sum(1, keepdims=True)
        new_k = self.keys[layer_id] * keep + ops.matmul(select, k)
        new_v = self.values[layer_id] * keep + ops.matmul(select.astype(v.dtype), v)
        ops.assign(self.keys[layer_id], new_k)
        ops.assign(self.values[layer_id], new_v)
        return new_k, new_v
