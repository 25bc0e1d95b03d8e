"""`load_balanced`: every needed chunk region is read by one rank and shared with the others.

All ranks know all requests (gathered during validation). For each stored chunk, the region to
read is the bounding box of what any rank needs from it; regions go to the least-loaded rank that
needs them (largest first), so replicated weights (data-parallel copies) are read once instead of
once per replica. Owners read, then one `exchange_bytes` delivers each rank its pieces.
"""

from __future__ import annotations

import pickle
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .collectives import Collective, exchange_bytes
from .errors import CheckpointError
from .extract import read_region
from .sharding import box_slices, write_box


def _bounding(boxes):
    lo = [min(b[0][d] for b in boxes) for d in range(len(boxes[0][0]))]
    hi = [max(b[0][d] + b[1][d] for b in boxes) for d in range(len(boxes[0][0]))]
    return tuple(lo), tuple(h - low for low, h in zip(lo, hi))


def assign_owners(all_requests, world: int):
    """{(part, name, chunk): (owner, region box, [(rank, request index)])}, same on every rank."""
    wanted = defaultdict(list)
    for rank, reqs in enumerate(all_requests):
        for i, r in enumerate(reqs):
            wanted[(r.part, r.name, r.chunk_index)].append((rank, i))
    regions = []
    for key, users in wanted.items():
        boxes = [(all_requests[rk][i].offset, all_requests[rk][i].shape) for rk, i in users]
        box = _bounding(boxes)
        first = all_requests[users[0][0]][users[0][1]]
        itemsize = first.nbytes // max(1, int(np.prod(first.shape)))
        regions.append((int(np.prod(box[1])) * itemsize, key, box, users))
    regions.sort(key=lambda r: (-r[0], r[1]))
    load = [0] * world
    plan = {}
    for nbytes, key, box, users in regions:
        owner = min({rk for rk, _ in users}, key=lambda rk: (load[rk], rk))
        load[owner] += nbytes
        plan[key] = (owner, box, users, nbytes)
    return plan


def load_balanced(comm: Collective, pool, layout, all_requests, dests, workers: int,
                  verify: bool = True) -> tuple[int, int, str | None]:
    """Returns (bytes read, regions read, this rank's read error or None). A rank whose reads fail
    still takes part in the exchange (sending nothing), so no rank is left waiting."""
    me = comm.rank
    plan = assign_owners(all_requests, comm.world_size)
    mine = [(key, box, users, nbytes) for key, (owner, box, users, nbytes) in plan.items() if owner == me]

    def read(item):
        (part, name, ci), box, users, _ = item
        chunk = layout.parts[part][name].chunks[ci]
        return read_region(pool, layout, part, name, chunk, box[0], box[1], verify).reshape(box[1])

    error = None
    try:
        if workers > 1 and len(mine) > 1:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mf-ckpt-reader") as ex:
                data = list(ex.map(read, mine))
        else:
            data = [read(item) for item in mine]
    except CheckpointError as e:
        error, mine, data = str(e), [], []

    outgoing: dict[int, list] = defaultdict(list)
    my_requests = all_requests[me]
    for ((part, name, _ci), box, users, _), region in zip(mine, data):
        for rank, i in users:
            req = all_requests[rank][i]
            piece = region[box_slices((req.offset, req.shape), box[0])]
            if rank == me:
                write_box(dests[part][name], req.offset, req.shape, piece)
            else:
                outgoing[rank].append((i, np.ascontiguousarray(piece)))
    incoming = exchange_bytes(comm, {rank: pickle.dumps(items, protocol=5) for rank, items in outgoing.items()})
    for blob in incoming.values():
        for i, piece in pickle.loads(blob):
            req = my_requests[i]
            write_box(dests[req.part][req.name], req.offset, req.shape, piece)
    return sum(item[3] for item in mine), len(mine), error

