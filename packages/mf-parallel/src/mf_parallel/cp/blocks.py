"""Blockwise attention: softmax(q k^T * scale + mask) v computed one key block at a time.

The semantics are mf-models' CoreAttention exactly: scores in float32, masked entries set to the
finite MASK_VALUE (so a row that sees no key gets a uniform softmax over every key, as in HF,
instead of NaN), and a masked entry passes no gradient to q or k.

Online softmax. A block of keys gives each query row the statistics
    m = max_j s_j,   l = sum_j exp(s_j - m),   acc = sum_j exp(s_j - m) v_j
and two blocks merge exactly as m = max(m1, m2), l = l1 e1 + l2 e2, acc = acc1 e1 + acc2 e2 with
e = exp(m_i - m); the output is acc / l (`total` in the code). m and l are kept apart rather than folded into one
log-sum-exp: for a fully masked row m = MASK_VALUE and l counts the keys, and float32 cannot hold
MASK_VALUE + log(count) (the log is absorbed), which would lose the uniform average.

A block that is masked for every row (a future chunk under the causal mask) is not computed: it
would contribute (MASK_VALUE, key count, sum of its values) to every row, which is zero for any
row that has seen a real key (exp(MASK_VALUE - m) == 0) and exactly the uniform average's share
for a row that has not. `merge_masked` adds just that (O(keys x d), no scores).

Backward, for the final (m, l) of a row and D = rowsum(dout * out):
    p = exp(s - m) / l,  dv = p^T dout,  ds = p (dout v^T - D) with masked entries zeroed,
    dq = ds k * scale,   dk = ds^T q * scale
and a masked block gets only dv += sum over rows of dout * exp(MASK_VALUE - m) / l per key.

Grouped-query attention without repeating keys: q [B, nH, S, d] is viewed as
[B, nKV, g, S, d] (head h uses key head h // g, repeat_kv's layout), so each key head's block is
one matmul over its g query heads and dk, dv come out summed over them.

Only primitives (ops.Select, ops.Triu, ...) are used: these functions also run inside GRAPH_MODE
bprops, where functional wrappers such as ops.masked_fill or ops.narrow fail to compile (2.10.0).
"""

from __future__ import annotations

import mindspore as ms
from mindspore import ops

MASK_VALUE = -3.4028234663852886e38     # CoreAttention's finite "minus infinity"

_bmm_t = ops.BatchMatMul(transpose_b=True)
_bmm = ops.BatchMatMul()
_bmm_ta = ops.BatchMatMul(transpose_a=True)
_cast = ops.Cast()
_exp = ops.Exp()
_max = ops.ReduceMax(keep_dims=True)
_sum = ops.ReduceSum(keep_dims=True)
_select = ops.Select()
_maximum = ops.Maximum()


def stats_dtype(x):
    """float32 for every input dtype but float64 (which keeps float64: the exactness tests)."""
    return ms.float64 if x.dtype == ms.float64 else ms.float32


def scaled(x, scale: float):
    """x * scale with the scale in x's dtype (a Python float multiplies as float32, even float64)."""
    return x * _cast(ms.Tensor(scale, ms.float64), x.dtype)


def narrow(x, axis: int, start: int, length: int):
    """x's slice [start, start + length) along `axis` (static bounds)."""
    begin = (0,) * axis + (start,) + (0,) * (x.ndim - axis - 1)
    size = x.shape[:axis] + (length,) + x.shape[axis + 1:]
    return ops.Slice()(x, begin, size)


def grouped(q, kv_heads: int):
    """[B, nH, S, d] -> [B, nKV, g, S, d]."""
    b, heads, s, d = q.shape
    return q.reshape(b, kv_heads, heads // kv_heads, s, d)


def ungrouped(x):
    """[B, nKV, g, S, d] -> [B, nKV * g, S, d]."""
    b, kv, g, s, d = x.shape
    return x.reshape(b, kv * g, s, d)


def _rows(x):
    """[B, nKV, g, S, d] -> [B, nKV, g * S, d] for a matmul per key head."""
    b, kv, g, s, d = x.shape
    return x.reshape(b, kv, g * s, d)


def scores(q5, k, scale: float, mask):
    """Masked float32 scores [B, nKV, g, Sq, Sk] of grouped queries q5 against keys k [B, nKV, Sk, d].

    `mask`: bool broadcastable to [B, 1, 1, Sq, Sk] (True = masked out) or None."""
    b, kv, g, sq, _ = q5.shape
    s = scaled(_cast(_bmm_t(_rows(q5), k), stats_dtype(q5)).reshape(b, kv, g, sq, k.shape[2]), scale)
    if mask is None:
        return s
    full = ops.BroadcastTo(s.shape)(mask)
    return _select(full, ops.OnesLike()(s) * MASK_VALUE, s)


def block_forward(q5, k, v, scale: float, mask):
    """(m, total, acc) of one key block: [B, nKV, g, Sq, 1], same, [B, nKV, g, Sq, dv] (float32)."""
    s = scores(q5, k, scale, mask)
    m = _max(s, -1)
    p = _exp(s - m)
    total = _sum(p, -1)
    b, kv, g, sq, sk = p.shape
    acc = _cast(_bmm(_cast(p, v.dtype).reshape(b, kv, g * sq, sk), v), p.dtype)
    return m, total, acc.reshape(b, kv, g, sq, v.shape[-1])


def merge(state, block):
    """Online-softmax merge of two (m, total, acc) statistics of the same rows."""
    m1, l1, a1 = state
    m2, l2, a2 = block
    m = _maximum(m1, m2)
    e1 = _exp(m1 - m)
    e2 = _exp(m2 - m)
    return m, l1 * e1 + l2 * e2, a1 * e1 + a2 * e2


def value_sum(v):
    """[B, nKV, Sk, dv] -> [B, nKV, 1, 1, dv] (float32): what a fully masked block adds per row."""
    total = _sum(_cast(v, stats_dtype(v)), 2)
    return ops.ExpandDims()(total, 2)


def merge_masked(state, v_total, count: int):
    """Merge a block masked for every row (not computed): (MASK_VALUE, count, v_total) per row.
    m never falls below MASK_VALUE, so it is unchanged."""
    m, total, acc = state
    e = _exp(MASK_VALUE - m)          # 1 for a row that has seen only masked keys, else exactly 0
    return m, total + e * float(count), acc + e * v_total


def split_rows(state, first: int):
    """Cut statistics of rows [0, S) into rows [0, first) and [first, S)."""
    rest = state[0].shape[3] - first
    return (tuple(narrow(x, 3, 0, first) for x in state), tuple(narrow(x, 3, first, rest) for x in state))


def finish(state, dtype):
    """The block-merged output acc / total, [B, nKV, g, S, dv] in `dtype`."""
    _, total, acc = state
    return _cast(acc / total, dtype)


def row_dot(dout5, out5):
    """D = rowsum(dout * out) [B, nKV, g, S, 1] float32, the softmax backward's row term."""
    dt = stats_dtype(dout5)
    return _sum(_cast(dout5, dt) * _cast(out5, dt), -1)


def block_backward(q5, k, v, rows, scale: float, mask):
    """(dq5, dk, dv) of one computed block; `rows` = (dout5, m, total, D) of its query rows, the final
    statistics (float32 inputs). (A tuple, not star-unpacked: that fails to compile in a bprop.)"""
    dout5, m, total, dsum = rows
    s = scores(q5, k, scale, mask)
    p = _exp(s - m) / total
    b, kv, g, sq, sk = p.shape
    p_rows = p.reshape(b, kv, g * sq, sk)
    do_rows = _rows(dout5)
    dv = _bmm_ta(p_rows, do_rows)
    dp = _bmm_t(do_rows, v).reshape(b, kv, g, sq, sk)
    ds = p * (dp - dsum)
    if mask is not None:
        ds = _select(ops.BroadcastTo(ds.shape)(mask), ops.ZerosLike()(ds), ds)
    ds_rows = ds.reshape(b, kv, g * sq, sk)
    dq = scaled(_bmm(ds_rows, k), scale).reshape(b, kv, g, sq, k.shape[-1])
    dk = scaled(_bmm_ta(ds_rows, _rows(q5)), scale)
    return dq, dk, dv


def masked_block_dv(rows, keys: int):
    """dv [B, nKV, keys, dv] a block masked for every row receives (only from fully masked rows)."""
    dout5, m, total, _ = rows
    w = _exp(MASK_VALUE - m) / total
    per_key = ops.ReduceSum(keep_dims=False)(w * _cast(dout5, w.dtype), (2, 3))     # [B, nKV, dv]
    b, kv, dv = per_key.shape
    return ops.BroadcastTo((b, kv, keys, dv))(ops.ExpandDims()(per_key, 2))


def causal_mask(rows: int, cols: int, offset: int):
    """[1, 1, 1, rows, cols] bool, True where key column j > query row i + offset."""
    ones = ops.Ones()((rows, cols), ms.float32)
    visible = ops.Triu(1 + offset)(ones)          # 1 strictly above the diagonal shifted by offset
    return _cast(visible, ms.bool_).reshape(1, 1, 1, rows, cols)


def segment_mask(seg_q, seg_k):
    """[B, 1, 1, Sq, Sk] bool from segment ids [B, Sq] and [B, Sk]: a key in another document, or a
    query marked as attending nothing (negative id), is masked."""
    b, sq = seg_q.shape
    sk = seg_k.shape[1]
    q = seg_q.reshape(b, 1, 1, sq, 1)
    other = ops.NotEqual()(q, seg_k.reshape(b, 1, 1, 1, sk))
    lonely = ops.Less()(q, ops.ZerosLike()(q))
    return ops.LogicalOr()(other, ops.BroadcastTo((b, 1, 1, sq, sk))(lonely))


def combine(a, b):
    """OR of two masks, either of which may be None."""
    if a is None:
        return b
    if b is None:
        return a
    return ops.LogicalOr()(a, b)
