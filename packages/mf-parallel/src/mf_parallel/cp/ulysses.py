"""Ulysses attention (context_parallel_method "ulysses") and the hybrid of Ulysses inside a ring.

Ulysses: an all-to-all over the u ranks of a group turns q, k, v from sequence-sharded
[B, heads, S_local, d] into head-sharded [B, heads / u, u x S_local, d]: every rank then holds the
whole gathered sequence for its share of the heads, runs ordinary attention on it (the model's
own core, so Ascend keeps its fused kernel), and a second all-to-all brings the output back to
sequence shards. Heads must divide by u. Grouped-query key/value heads that do not divide by u
are repeated first, u / gcd(kv_heads, u) times (the fewest copies for which every rank gets whole
key heads for its query heads: rank j's query heads then map to its own key heads).

The gathered sequence is the group members' zigzag chunks in member order; its mask is built
from their global positions (no data is reordered): key j visible to query i iff pos_j <= pos_i
and, with packed documents, same non-negative segment id.

Hybrid (`ulysses_degree_in_cp` u): the cp ranks split as ring x u, Ulysses groups of u
neighbouring cp ranks inside, rings across them (`ParallelDims.cp_subgroup_ranks`). A Ulysses
group R holds chunks R u .. R u + u - 1 and their zigzag partners, i.e. exactly chunks R and
2 ring - 1 - R of the ring's 2 ring chunks (each u times longer): after the all-to-all its
members' pieces are put in that order (a static permutation of 2u pieces) and ring attention
runs over the ring group on the rank's heads.

Cost per layer (forward): Ulysses 4 all-to-alls (q, k, v, out) of the local activations, and
full [S, S] attention scores for heads / u heads (the memory of one-process attention divided by
u); the ring keeps only [S/cp, S/cp]-sized blocks.
"""

from __future__ import annotations

import math

import mindspore as ms
from mindspore import nn, ops

from mf_parallel.collectives import AllToAll
from mf_parallel.cp.ring import RingAttention, check_attention_inputs
from mf_parallel.mesh import Group


def kv_repeats(kv_heads: int, degree: int) -> int:
    """How many times each key/value head is repeated so that `degree` ranks get whole ones."""
    return degree // math.gcd(kv_heads, degree)


def repeat_heads(x, times: int):
    """[B, h, S, d] -> [B, h * times, S, d], each head repeated in place (repeat_kv's layout)."""
    if times == 1:
        return x
    b, h, s, d = x.shape
    return ops.BroadcastTo((b, h, times, s, d))(ops.ExpandDims()(x, 2)).reshape(b, h * times, s, d)


class SeqToHeads(nn.Cell):
    """[B, h, S_local, d] sequence-sharded -> [B, h / u, u x S_local, d] head-sharded (all-to-all);
    the backward is the reverse all-to-all."""

    def __init__(self, group: Group) -> None:
        super().__init__()
        self.forward_a2a = AllToAll(group, split_axis=1, concat_axis=2)
        self.backward_a2a = AllToAll(group, split_axis=2, concat_axis=1)

    def construct(self, x):
        return self.forward_a2a(x)

    def bprop(self, x, out, dout):
        return (self.backward_a2a(dout),)


class HeadsToSeq(nn.Cell):
    """The inverse of SeqToHeads; the backward is SeqToHeads."""

    def __init__(self, group: Group) -> None:
        super().__init__()
        self.forward_a2a = AllToAll(group, split_axis=2, concat_axis=1)
        self.backward_a2a = AllToAll(group, split_axis=1, concat_axis=2)

    def construct(self, x):
        return self.forward_a2a(x)

    def bprop(self, x, out, dout):
        return (self.backward_a2a(dout),)


def gathered_positions(local_len: int, cp: int, members):
    """Global positions [u x local_len] int32 of the tokens a Ulysses all-to-all gathers from cp ranks
    `members` (each holding chunks m and 2cp-1-m of length local_len / 2), in member order."""
    c = local_len // 2
    pieces = ()
    for m in members:
        pieces = pieces + (ops.arange(m * c, (m + 1) * c, dtype=ms.int32),
                           ops.arange((2 * cp - 1 - m) * c, (2 * cp - m) * c, dtype=ms.int32))
    return ops.Concat(0)(pieces)


class UlyssesAttention(nn.Cell):
    """Ulysses over the whole cp group; `inner(q, k, v, mask)` is the model's attention core
    (mask: bool [B|1, 1, S, S], True = masked out, CoreAttention's convention)."""

    def __init__(self, group: Group, inner: nn.Cell) -> None:
        super().__init__()
        self.u = group.size
        self.members = tuple(range(group.size))     # cp ranks, in group order
        self.to_heads = SeqToHeads(group)
        self.to_seq = HeadsToSeq(group)
        self.inner = inner

    def construct(self, q, k, v, segment_ids=None):
        check_attention_inputs(q, k, v, segment_ids, self.u, "Ulysses attention")
        if q.shape[1] % self.u:
            raise ValueError(f"Ulysses attention: {q.shape[1]} heads do not split over {self.u} ranks")
        times = kv_repeats(k.shape[1], self.u)
        local = q.shape[2]
        out = self.inner(self.to_heads(q), self.to_heads(repeat_heads(k, times)),
                         self.to_heads(repeat_heads(v, times)), self.mask(local, segment_ids))
        return self.to_seq(out)

    def mask(self, local: int, segment_ids):
        pos = gathered_positions(local, self.u, self.members)
        n = pos.shape[0]
        masked = ops.Greater()(pos.reshape(1, n), pos.reshape(n, 1)).reshape(1, 1, n, n)
        if segment_ids is None:
            return masked
        seg = ops.Gather()(segment_ids, pos, 1)                               # [B, S] in gathered order
        b = seg.shape[0]
        other = ops.NotEqual()(seg.reshape(b, 1, n, 1), seg.reshape(b, 1, 1, n))
        lonely = ops.BroadcastTo((b, 1, n, n))(ops.Less()(seg, ops.ZerosLike()(seg)).reshape(b, 1, n, 1))
        return ops.LogicalOr()(ops.LogicalOr()(masked, other), lonely)


class HybridAttention(nn.Cell):
    """Ulysses inside (`ulysses` group of u cp ranks), ring attention across (`ring` group)."""

    def __init__(self, ulysses: Group, ring: Group, scale: float, async_comm: bool = False) -> None:
        super().__init__()
        self.u = ulysses.size
        self.cp = ulysses.size * ring.size
        self.to_heads = SeqToHeads(ulysses)
        self.to_seq = HeadsToSeq(ulysses)
        self.ring = RingAttention(ring, scale, async_comm)
        u = self.u
        # Member j's pieces arrive as 2j (chunk R u + j) and 2j + 1 (its zigzag partner).
        self.order = tuple(2 * j for j in range(u)) + tuple(2 * (u - 1 - t) + 1 for t in range(u))
        inverse = [0] * (2 * u)
        for new, old in enumerate(self.order):
            inverse[old] = new
        self.inverse = tuple(inverse)

    def permute(self, x, order):
        pieces = ops.Split(2, 2 * self.u)(x)
        picked = ()
        for i in order:
            picked = picked + (pieces[i],)
        return ops.Concat(2)(picked)

    def construct(self, q, k, v, segment_ids=None):
        check_attention_inputs(q, k, v, segment_ids, self.cp, "hybrid context-parallel attention")
        if q.shape[1] % self.u:
            raise ValueError(f"hybrid attention: {q.shape[1]} heads do not split over ulysses_degree_in_cp {self.u}")
        times = kv_repeats(k.shape[1], self.u)
        q2 = self.permute(self.to_heads(q), self.order)
        k2 = self.permute(self.to_heads(repeat_heads(k, times)), self.order)
        v2 = self.permute(self.to_heads(repeat_heads(v, times)), self.order)
        out = self.ring(q2, k2, v2, segment_ids)
        return self.to_seq(self.permute(out, self.inverse))
