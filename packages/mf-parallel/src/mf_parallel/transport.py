"""Exact float32 transport for dtypes a backend cannot all-reduce (MCCL: only float32/float16).

Every all-reduce-based path (AllReduce itself and every emulation) carries other dtypes through
float32 without losing a bit:
- bfloat16 widens to float32 (bf16 is a subset of fp32);
- bool, int8, uint8, int16 are small integers, exact in float32 (sums of < 256 ranks too);
- int32 / int64 are cut into 16-bit digits (2 / 4 float32 channels in a new last axis): each digit
  is below 2^16, so a sum over fewer than 256 ranks stays below 2^24 and is exact in float32;
  recombining the digit sums in int64 gives the exact sum with the integer type's wrap-around.
Decoding is the inverse; both compile in GRAPH_MODE (branches on the constant dtype).
"""

from __future__ import annotations

import mindspore as ms
from mindspore import ops

NATIVE_REDUCE_DTYPES = {"mccl": (ms.float32, ms.float16)}   # hccl/nccl: every dtype
MAX_RANKS = 256   # beyond this, digit sums could pass 2^24 and lose exactness
_SMALL = (ms.bool_, ms.int8, ms.uint8, ms.int16)


def needs_transport(backend: str) -> bool:
    return backend in NATIVE_REDUCE_DTYPES


def encode(x):
    """x -> float32/float16 tensor (int32/int64 gain a trailing digit axis)."""
    if x.dtype == ms.float32 or x.dtype == ms.float16:
        return x
    if x.dtype == ms.bfloat16 or x.dtype in _SMALL:
        return ops.Cast()(x, ms.float32)
    digits = 4 if x.dtype == ms.int64 else 2
    value = ops.Cast()(x, ms.int64)
    base = ms.Tensor(65536, ms.int64)
    mask = ms.Tensor(65535, ms.int64)
    channels = ()
    for i in range(digits):
        if i == digits - 1:
            channels = channels + (ops.Cast()(value, ms.float32),)     # the top digit keeps the sign
        else:
            # bitwise_and, not floor_mod: the CPU FloorMod kernel rounds int64 through float64.
            channels = channels + (ops.Cast()(ops.BitwiseAnd()(value, mask), ms.float32),)
            value = ops.FloorDiv()(value, base)
    return ops.Stack(-1)(channels)


def decode(y, dtype):
    """Inverse of `encode` for a tensor of the original `dtype` (after any sum of encodings)."""
    if dtype == ms.float32 or dtype == ms.float16:
        return y
    if dtype == ms.bool_:
        return y != 0
    if dtype == ms.bfloat16 or dtype in _SMALL:
        return ops.Cast()(y, dtype)
    digits = ops.Cast()(y, ms.int64)
    total = digits[..., 0]
    for i in range(1, y.shape[-1]):
        total = total + digits[..., i] * ms.Tensor(2 ** (16 * i), ms.int64)
    return ops.Cast()(total, dtype)
