"""Ring attention (context_parallel_method "colossal") with the zigzag layout and a ring backward.

Rank r of a ring of n holds query, key and value chunks a = r and b = 2n-1-r of the 2n chunks
(`layout.py`). At step s it holds the key/value block of rank src = r - s (mod n), with chunks
src and 2n-1-src, and computes only the pairs the causal mask leaves visible:

    step 0 (own block)   q_a x k_a (causal)   q_b x [k_a, k_b] (k_a visible, k_b causal)
    src < r              [q_a, q_b] x k_src   (k_src is before both query chunks; k_2n-1-src after)
    src > r              q_b x [k_src, k_2n-1-src]  (both before q_b, both after q_a)

so every step of every rank multiplies c x 2c queries by keys (c = chunk length), except step 0's
3c^2: the work is balanced. Pairs wholly in the future are skipped (see `blocks.merge_masked` for
the exact contribution they still make to a fully masked row). Partial results merge by online
softmax; packed documents add each pair's segment mask (`blocks.segment_mask`) from the global
`segment_ids` every rank holds.

Communication: key and value travel together (one buffer) to the next rank after each step
(`RingExchange`), n - 1 times. The backward (a custom bprop) runs the ring again from the saved
q, k, v, output and row statistics (m, l) only, never keeping another rank's block: dq stays
local while dk, dv accumulate in a buffer that travels with its key/value block, and after the
last step go one more hop, back to their owner. Forward n - 1 messages of |k| + |v|, backward
n - 1 of 2(|k| + |v|) plus one of |k| + |v|.

`async_comm` (context_parallel_async): each step's exchange of the next block is issued before
the step's block computation, which a backend with asynchronous collectives (Ascend) overlaps;
in the backward the next key/value block travels ahead and dk, dv follow after the computation.
Without it the exchange is made to wait for the computation (one combined message per backward
step). On synchronous backends (CPU) the order changes but nothing overlaps.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from mf_parallel.cp import blocks
from mf_parallel.cp.blocks import narrow
from mf_parallel.cp.exchange import RingExchange
from mf_parallel.mesh import Group

OWN, EARLIER, LATER = 0, 1, 2


def check_attention_inputs(q, k, v, segment_ids, ring: int, what: str) -> None:
    """Shape checks at trace time (constants in GRAPH_MODE): one line naming what is wrong."""
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"{what}: q, k, v must be [B, heads, S_local, d]")
    if q.shape[1] % k.shape[1] or k.shape[1] != v.shape[1]:
        raise ValueError(f"{what}: {k.shape[1]} key/value heads do not serve {q.shape[1]} query heads")
    if q.shape[2] % 2 or k.shape[2] != q.shape[2] or v.shape[2] != q.shape[2]:
        raise ValueError(f"{what}: the local sequence ({q.shape[2]} tokens) must be this rank's two equal chunks")
    if segment_ids is not None:
        if segment_ids.ndim != 2 or segment_ids.shape[1] != ring * q.shape[2] or segment_ids.dtype == ms.bool_:
            raise ValueError(
                f"{what}: under context parallelism the attention input is segment_ids [B, S] (integer document ids "
                f"of the full sequence of {ring * q.shape[2]} tokens), not a dense mask; got shape "
                f"{list(segment_ids.shape)} {segment_ids.dtype}")


class _RingCore(nn.Cell):
    """(q, k, v, segment_ids) -> (output, m, total); the bprop runs the backward ring."""

    def __init__(self, group: Group, scale: float, async_comm: bool, exchange=None) -> None:
        super().__init__()
        self.n = group.size
        self.r = group.rank
        self.scale = float(scale)
        self.async_comm = bool(async_comm)
        # `exchange` replaces the ring shift in single-process simulations of the schedule (tests).
        self.exchange = RingExchange(group) if exchange is None else exchange
        # The schedule as constant tuples (kind, source rank): GRAPH_MODE unrolls a loop over a constant
        # tuple; the last step (no exchange after it) is taken out of the loops, which keeps every
        # branch inside them on constant attributes (a branch on a loop item reassigning loop
        # variables failed to compile in a bprop on 2.10.0: "start_offset ... exceeds the number of new args").
        steps = []
        for s in range(self.n):
            src = (self.r - s) % self.n
            steps.append((OWN if s == 0 else (EARLIER if src < self.r else LATER), src))
        self.steps = tuple(steps)
        self.first_steps = self.steps[:-1]            # steps followed by an exchange
        self.middle_steps = self.steps[1:-1]
        self.last_step = self.steps[-1]

    # ---------------------------------------------------------------- shared pieces
    def chunk_ids(self, seg, chunk: int, c: int):
        """Segment ids of global chunk `chunk` ([B, c]), or None without packed documents."""
        if seg is None:
            return None
        return narrow(seg, 1, chunk * c, c)

    def pair_mask(self, seg_q, seg_k, causal):
        if seg_q is None:
            return causal
        return blocks.combine(causal, blocks.segment_mask(seg_q, seg_k))

    def own_masks(self, seg, c):
        """Masks of step 0's two pairs: q_a x k_a and q_b x [k_a, k_b]."""
        sa = self.chunk_ids(seg, self.r, c)
        sb = self.chunk_ids(seg, 2 * self.n - 1 - self.r, c)
        mask_a = self.pair_mask(sa, sa, blocks.causal_mask(c, c, 0))
        both = None if seg is None else ops.Concat(1)((sa, sb))
        mask_b = self.pair_mask(sb, both, blocks.causal_mask(c, 2 * c, c))
        return mask_a, mask_b

    def visiting_mask(self, seg, c, kind, src):
        """Mask of the one computed pair of a visiting block (None: all visible, plain causal)."""
        if seg is None:
            return None
        sa = self.chunk_ids(seg, self.r, c)
        sb = self.chunk_ids(seg, 2 * self.n - 1 - self.r, c)
        if kind == EARLIER:
            return blocks.segment_mask(ops.Concat(1)((sa, sb)), self.chunk_ids(seg, src, c))
        keys = ops.Concat(1)((self.chunk_ids(seg, src, c), self.chunk_ids(seg, 2 * self.n - 1 - src, c)))
        return blocks.segment_mask(sb, keys)

    # ---------------------------------------------------------------- forward
    def construct(self, q, k, v, seg):
        d = k.shape[-1]
        c = q.shape[2] // 2
        q5 = blocks.grouped(q, k.shape[1])
        qa, qb = narrow(q5, 3, 0, c), narrow(q5, 3, c, c)
        packed = ops.Concat(-1)((k, v))
        # step 0: the rank's own block (exchanged on while, or after, it is computed)
        nxt = packed
        if self.async_comm and self.n > 1:
            nxt = self.exchange(packed)
        mask_a, mask_b = self.own_masks(seg, c)
        state_a = blocks.block_forward(qa, narrow(k, 2, 0, c), narrow(v, 2, 0, c), self.scale, mask_a)
        state_b = blocks.block_forward(qb, k, v, self.scale, mask_b)
        if seg is not None:
            state_a = blocks.merge_masked(state_a, blocks.value_sum(narrow(v, 2, c, c)), c)
        if not self.async_comm and self.n > 1:
            nxt = self.exchange(ops.depend(ops.depend(packed, state_a[2]), state_b[2]))
        for kind, src in self.middle_steps:
            packed = nxt
            if self.async_comm:
                nxt = self.exchange(packed)
            state_a, state_b = self.forward_step(kind, src, q5, qb, packed, d, seg, c, state_a, state_b)
            if not self.async_comm:
                nxt = self.exchange(ops.depend(ops.depend(packed, state_a[2]), state_b[2]))
        if self.n > 1:
            kind, src = self.last_step
            state_a, state_b = self.forward_step(kind, src, q5, qb, nxt, d, seg, c, state_a, state_b)
        out = ops.Concat(3)((blocks.finish(state_a, q.dtype), blocks.finish(state_b, q.dtype)))
        m = ops.Concat(3)((state_a[0], state_b[0]))
        total = ops.Concat(3)((state_a[1], state_b[1]))
        return blocks.ungrouped(out), m, total

    def forward_step(self, kind, src, q5, qb, packed, d, seg, c, state_a, state_b):
        k, v = narrow(packed, 3, 0, d), narrow(packed, 3, d, packed.shape[3] - d)
        mask = self.visiting_mask(seg, c, kind, src)
        if kind == EARLIER:
            block = blocks.block_forward(q5, narrow(k, 2, 0, c), narrow(v, 2, 0, c), self.scale, mask)
            block_a, block_b = blocks.split_rows(block, c)
            state_a = blocks.merge(state_a, block_a)
            state_b = blocks.merge(state_b, block_b)
            if seg is not None:
                later = blocks.value_sum(narrow(v, 2, c, c))
                state_a = blocks.merge_masked(state_a, later, c)
                state_b = blocks.merge_masked(state_b, later, c)
        else:
            state_b = blocks.merge(state_b, blocks.block_forward(qb, k, v, self.scale, mask))
            if seg is not None:
                state_a = blocks.merge_masked(state_a, blocks.value_sum(v), 2 * c)
        return state_a, state_b

    # ---------------------------------------------------------------- backward
    def bprop(self, q, k, v, seg, out, dout):
        f32 = blocks.stats_dtype(q)
        nkv, d = k.shape[1], k.shape[-1]
        c = q.shape[2] // 2
        q5 = blocks.grouped(ops.Cast()(q, f32), nkv)
        qa, qb = narrow(q5, 3, 0, c), narrow(q5, 3, c, c)
        do5 = blocks.grouped(ops.Cast()(dout[0], f32), nkv)
        o5 = blocks.grouped(out[0], nkv)
        m, total = out[1], out[2]
        dsum = blocks.row_dot(do5, o5)
        rows_a = (narrow(do5, 3, 0, c), narrow(m, 3, 0, c), narrow(total, 3, 0, c), narrow(dsum, 3, 0, c))
        rows_b = (narrow(do5, 3, c, c), narrow(m, 3, c, c), narrow(total, 3, c, c), narrow(dsum, 3, c, c))
        rows = (do5, m, total, dsum)
        packed = ops.Concat(-1)((ops.Cast()(k, f32), ops.Cast()(v, f32)))
        dq_a = ops.Zeros()(qa.shape, f32)
        dq_b = ops.Zeros()(qb.shape, f32)
        dacc = ops.Zeros()(packed.shape, f32)
        for kind, src in self.first_steps:
            packed, dq_a, dq_b, dacc = self.backward_and_pass(kind, src, q5, qa, qb, packed, d, seg, c, rows, rows_a,
                                                              rows_b, dq_a, dq_b, dacc)
        kind, src = self.last_step
        dq_a, dq_b, dacc = self.backward_step(kind, src, q5, qa, qb, packed, d, seg, c, rows, rows_a, rows_b,
                                              dq_a, dq_b, dacc)
        if self.n > 1:
            dacc = self.exchange(dacc)              # the last block's gradients go home to their owner
        dq = ops.Cast()(blocks.ungrouped(ops.Concat(3)((dq_a, dq_b))), q.dtype)
        dk = ops.Cast()(narrow(dacc, 3, 0, d), k.dtype)
        dv = ops.Cast()(narrow(dacc, 3, d, dacc.shape[3] - d), v.dtype)
        dseg = None if seg is None else ops.ZerosLike()(seg)
        return dq, dk, dv, dseg

    def backward_and_pass(self, kind, src, q5, qa, qb, packed, d, seg, c, rows, rows_a, rows_b, dq_a, dq_b, dacc):
        """One backward step followed by the exchange: (next block, dq_a, dq_b, its dk/dv so far)."""
        if self.async_comm:
            nxt = self.exchange(packed)
            dq_a, dq_b, dacc = self.backward_step(kind, src, q5, qa, qb, packed, d, seg, c, rows, rows_a, rows_b,
                                                  dq_a, dq_b, dacc)
            # dk/dv follow their block; the dependency keeps the two messages in one order on every rank.
            return nxt, dq_a, dq_b, self.exchange(ops.depend(dacc, nxt))
        dq_a, dq_b, dacc = self.backward_step(kind, src, q5, qa, qb, packed, d, seg, c, rows, rows_a, rows_b,
                                              dq_a, dq_b, dacc)
        width = packed.shape[3]
        both = self.exchange(ops.Concat(-1)((packed, dacc)))
        return narrow(both, 3, 0, width), dq_a, dq_b, narrow(both, 3, width, width)

    def backward_step(self, kind, src, q5, qa, qb, packed, d, seg, c, rows, rows_a, rows_b, dq_a, dq_b, dacc):
        k, v = narrow(packed, 3, 0, d), narrow(packed, 3, d, packed.shape[3] - d)
        cat2 = ops.Concat(2)
        if kind == OWN:
            mask_a, mask_b = self.own_masks(seg, c)
            dqa, dk1, dv1 = blocks.block_backward(qa, narrow(k, 2, 0, c), narrow(v, 2, 0, c), rows_a, self.scale,
                                                  mask_a)
            dqb, dk2, dv2 = blocks.block_backward(qb, k, v, rows_b, self.scale, mask_b)
            dk = cat2((dk1 + narrow(dk2, 2, 0, c), narrow(dk2, 2, c, c)))
            second_dv = narrow(dv2, 2, c, c)
            if seg is not None:
                second_dv = second_dv + blocks.masked_block_dv(rows_a, c)
            dv = cat2((dv1 + narrow(dv2, 2, 0, c), second_dv))
            return dq_a + dqa, dq_b + dqb, dacc + ops.Concat(-1)((dk, dv))
        mask = self.visiting_mask(seg, c, kind, src)
        if kind == EARLIER:
            dq, dk1, dv1 = blocks.block_backward(q5, narrow(k, 2, 0, c), narrow(v, 2, 0, c), rows, self.scale, mask)
            later_dv = ops.ZerosLike()(dv1)
            if seg is not None:
                later_dv = blocks.masked_block_dv(rows, c)
            grads = cat2((ops.Concat(-1)((dk1, dv1)), ops.Concat(-1)((ops.ZerosLike()(dk1), later_dv))))
            return dq_a + narrow(dq, 3, 0, c), dq_b + narrow(dq, 3, c, c), dacc + grads
        dqb, dk, dv = blocks.block_backward(qb, k, v, rows_b, self.scale, mask)
        if seg is not None:
            dv = dv + blocks.masked_block_dv(rows_a, 2 * c)
        return dq_a, dq_b + dqb, dacc + ops.Concat(-1)((dk, dv))


class RingAttention(nn.Cell):
    """Ring attention over `group` for q [B, nH, S_local, d], k/v [B, nKV, S_local, d|dv] holding this
    rank's chunks r and 2n-1-r; `segment_ids` [B, S] (global document ids, see `layout.py`) or None
    for plain causal attention. Returns [B, nH, S_local, dv] in q's dtype."""

    def __init__(self, group: Group, scale: float, async_comm: bool = False) -> None:
        super().__init__()
        self.n = group.size
        self.core = _RingCore(group, scale, async_comm)

    def construct(self, q, k, v, segment_ids=None):
        check_attention_inputs(q, k, v, segment_ids, self.n, "ring attention")
        out, _, _ = self.core(q, k, v, segment_ids)
        return out
