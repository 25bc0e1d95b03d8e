"""Where the sends and receives go: communication placed so that blocking p2p cannot deadlock.

The compute orders are timed on the plan costs (`dataflow.timings`). Every activation or gradient
that crosses ranks becomes a message at the moment its producer finishes, t. One global key orders
every action of every rank: a computation by its start, a message by (t, its channel), messages
before computations at equal times. Each rank's list is its own actions sorted by that key, and
messages of one channel with the same t travel together in one `Comm` (one rendezvous each way).

Why this cannot deadlock, even when every Comm blocks until the peer arrives (MCCL's emulated
send_recv does): a rank waiting at a Comm of key k waits for a peer that has not reached it, so
the peer is waiting at a Comm of a smaller key (lists are sorted and computations never block);
keys cannot decrease forever. A receive comes before its consumer (which starts at t or later)
and a send after its producer (which ended at t). The validator re-checks all of it by simulation.
"""

from __future__ import annotations

from collections import defaultdict

from mf_parallel.pipeline.actions import Comm, Message, computes
from mf_parallel.pipeline.dataflow import Costs, timings
from mf_parallel.pipeline.stages import Placement


def outgoing(placement: Placement, c, rank: int) -> list[Message]:
    """The messages computation `c` on `rank` produces for other ranks."""
    out = []
    if c.op == "F" and c.stage < placement.virtual_stages - 1:
        dst = placement.rank_of(c.stage + 1)
        if dst != rank:
            out.append(Message("act", c.mb, c.stage, rank, dst))
    elif c.op == "B" and c.stage > 0:
        dst = placement.rank_of(c.stage - 1)
        if dst != rank:
            out.append(Message("grad", c.mb, c.stage - 1, rank, dst))
    return out


def place_communication(placement: Placement, orders: list[list], costs: Costs, split: bool) -> list[list]:
    """Each rank's compute order with its Comm actions inserted (see the module docstring)."""
    times = timings(placement, orders, costs.exact(), split)
    groups: dict[tuple, list[Message]] = defaultdict(list)      # (t, lo, hi) -> messages
    for rank, order in enumerate(orders):
        for action, (_, end) in zip(order, times[rank]):
            for c in computes(action):
                for msg in outgoing(placement, c, rank):
                    groups[(end, min(msg.src, msg.dst), max(msg.src, msg.dst))].append(msg)
    keyed: list[list[tuple]] = [[] for _ in orders]
    for rank, order in enumerate(orders):
        for i, (action, (start, _)) in enumerate(zip(order, times[rank])):
            keyed[rank].append(((start, 1, 0, 0, i), action))
    for (t, lo, hi), msgs in groups.items():
        msgs = sorted(msgs)
        for me, peer in ((lo, hi), (hi, lo)):
            comm = Comm(peer=peer, sends=tuple(m for m in msgs if m.src == me),
                        recvs=tuple(m for m in msgs if m.dst == me))
            keyed[me].append(((t, 0, lo, hi, 0), comm))
    return [[action for _, action in sorted(items, key=lambda x: x[0])] for items in keyed]
