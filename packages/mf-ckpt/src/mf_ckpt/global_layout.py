"""Save side of the layout: describe each rank's chunks, gather them once, decide who writes what.

The global layout (metadata.json and each rank's write list) depends only on the structure of the
sharded state (names, dtypes, shapes, offsets, replica ids), not on values. `LayoutCache` keeps it
with a fingerprint of every rank's structure; later saves only gather fingerprints (a few bytes
per rank) and reuse the layout when they match.
"""

from __future__ import annotations

import json
import math
import pickle
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from . import dtypes
from .ckpt_dir import FORMAT, FORMAT_VERSION, shard_file
from .errors import CheckpointError
from .layout import Chunk, TensorMeta, check_coverage, tensors_to_json
from .sharding import ShardedTensor, replicated


class LocalEntry(NamedTuple):  # a tuple: gathered from every rank, so cheap to pickle
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: tuple[int, ...]
    chunk: tuple[int, ...]
    replica: int


LocalDescription = dict[str, list[LocalEntry]]  # part -> entries


def as_sharded(state: Mapping[str, object], part: str) -> dict[str, ShardedTensor]:
    """Normalise a state dict: plain arrays are replicated tensors (replica 0)."""
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{part} state must be a mapping of names to ShardedTensor or numpy arrays")
    out = {}
    for name, value in state.items():
        if not isinstance(name, str) or not name:
            raise CheckpointError(f"{part} state: tensor names must be non-empty strings, got {name!r}")
        if isinstance(value, ShardedTensor):
            out[name] = value
        elif isinstance(value, np.ndarray):
            out[name] = replicated(value)
        else:
            raise CheckpointError(f"{part} state: {name!r} is a {type(value).__name__}, expected ShardedTensor or ndarray")
    return out


def describe(states: Mapping[str, Mapping[str, ShardedTensor]]) -> LocalDescription:
    out: LocalDescription = {}
    for part, state in states.items():
        entries = []
        for name, st in state.items():
            try:
                code = dtypes.code_of(st.data.dtype)
            except CheckpointError as e:
                raise CheckpointError(f"{part} tensor {name!r}: {e}") from None
            entries.append(LocalEntry(name, code, st.global_shape, st.global_offset, st.chunk_shape, st.replica_id))
        out[part] = entries
    return out


def signature(states: Mapping[str, Mapping[str, ShardedTensor]]) -> tuple:
    """Everything the global layout depends on, read from attributes only. Compared with `==`
    against the previous save's (exact, C speed): this runs on every save to verify the cache."""
    return tuple(
        (part, name, st.data.dtype, st.global_shape, st.global_offset, st.data.shape, st.replica_id)
        for part, state in states.items()
        for name, st in state.items()
    )


@dataclass
class GlobalLayout:
    metadata_bytes: bytes
    tensors: dict[str, dict[str, TensorMeta]]
    writes: list[dict[str, list[str]]]  # per rank: part -> names this rank writes
    files: list[str]


def build(gathered: list[LocalDescription], prefix: str, remove_redundancy: bool) -> GlobalLayout:
    """Check the ranks' descriptions against each other and assign a writer to every chunk."""
    world = len(gathered)
    parts = sorted({p for d in gathered for p in d}, key=lambda p: ("model", "optimizer").index(p))
    writes: list[dict[str, list[str]]] = [{p: [] for p in parts} for _ in range(world)]
    load = [0] * world
    tensors: dict[str, dict[str, TensorMeta]] = {}
    file_names = {part: [shard_file(prefix, part, r, world) for r in range(world)] for part in parts}
    for part in parts:
        missing = [r for r, d in enumerate(gathered) if part not in d]
        if missing:
            raise CheckpointError(f"{part} state was given on some ranks but not on rank(s) {missing}")
        info: dict[str, tuple[str, tuple[int, ...]]] = {}
        holders: dict[str, dict[tuple, list[tuple[int, int]]]] = {}
        for rank, desc in enumerate(gathered):
            for e in desc[part]:
                known = info.setdefault(e.name, (e.dtype, e.shape))
                if known != (e.dtype, e.shape):
                    raise CheckpointError(
                        f"{part} tensor {e.name!r}: rank {rank} has {e.dtype}{list(e.shape)}, "
                        f"another rank {known[0]}{list(known[1])}"
                    )
                boxes = holders.setdefault(e.name, {})
                if math.prod(e.chunk):
                    boxes.setdefault((e.offset, e.chunk), []).append((e.replica, rank))
        items = []
        for name, (code, shape) in info.items():
            check_coverage(f"{part} state", name, shape, list(holders[name]))
            for box, owners in holders[name].items():
                items.append((math.prod(box[1]) * dtypes.itemsize(code), name, box, sorted(owners)))
        chunks: dict[str, list[Chunk]] = {name: [] for name in info}
        if remove_redundancy:
            # Largest first, each to the least-loaded of its replicas: every chunk once, bytes even.
            items.sort(key=lambda it: (-it[0], it[1], it[2]))
        for nbytes, name, box, owners in items:
            if remove_redundancy:
                writer = min(owners, key=lambda o: (load[o[1]], o[0], o[1]))[1]
                writers = [writer]
            else:
                writer = owners[0][1]  # lowest replica id is the copy metadata points at
                writers = [o[1] for o in owners]
            for w in writers:
                writes[w][part].append(name)
                load[w] += nbytes
            chunks[name].append(Chunk(box[0], box[1], file_names[part][writer], name))
        for name in chunks:
            chunks[name].sort(key=lambda c: c.offset)
        tensors[part] = {name: TensorMeta(code, shape, chunks[name]) for name, (code, shape) in info.items()}
    files = sorted(file_names[part][r] for r in range(world) for part in parts if writes[r][part])
    metadata = {"format": FORMAT, "format_version": FORMAT_VERSION, "world_size": world, "prefix": prefix,
                "files": files}
    metadata.update({part: tensors_to_json(tensors[part]) for part in parts})
    # Compact on purpose: the C encoder is an order of magnitude faster than indent=...
    blob = (json.dumps(metadata, separators=(",", ":"), sort_keys=True) + "\n").encode("utf-8")
    return GlobalLayout(blob, tensors, writes, files)


@dataclass
class RankPlan:
    """What one rank needs from the global layout: its write list; rank 0 also the metadata."""

    writes: dict[str, list[str]]  # part -> names this rank writes
    metadata_bytes: bytes | None  # rank 0 only


@dataclass
class LayoutCache:
    signature: tuple
    plan: RankPlan
    token: str = ""          # rank 0's staging token of the save that built it (the same on every rank)
    uses: int = 0

    def next_token(self) -> str:
        """A staging token every rank derives alike, without a collective: saves are collective,
        so every rank's cache has been used the same number of times."""
        self.uses += 1
        return f"{self.token}{self.uses:x}"


def _raise_first(gathered, index: int = 0) -> None:
    failures = [(r, g[index]) for r, g in enumerate(gathered) if g is not None and g[index]]
    if failures:
        r, msg = failures[0]
        raise CheckpointError(msg if len(gathered) == 1 else f"rank {r}: {msg}")


def agree_layout(comm, states, iteration: int, error: str | None, cache: LayoutCache | None, prefix: str,
                 remove_redundancy: bool) -> tuple[RankPlan, LayoutCache, bool, str]:
    """The metadata phase of a save: every rank ends with its RankPlan, or all raise the same error.

    With a cache, each rank compares its structure with the previous save's and one gather of
    flags decides (the cheap path; a synchronous Saver skips even that and lets its commit decide). Otherwise the ranks gather their descriptions as opaque
    bytes, rank 0 alone unpickles them and builds the layout, and a second gather hands each rank
    its write list (or rank 0's error). Returns (plan, new cache, cache hit, staging token).
    """
    rank = comm.rank
    sig = signature(states) if error is None else None
    unchanged = cache is not None and sig == cache.signature
    blob = None
    if cache is None and error is None:  # no cache to check: send the description in this round
        try:
            blob = pickle.dumps(describe(states), protocol=5)
        except CheckpointError as e:
            error = str(e)
    token = secrets.token_hex(4) if rank == 0 else None
    gathered = comm.all_gather_object((error, iteration, unchanged, token, blob))
    _raise_first(gathered)
    if len({g[1] for g in gathered}) != 1:
        raise CheckpointError(f"ranks disagree on the iteration to save: {[g[1] for g in gathered]}")
    token = gathered[0][3]
    if cache is not None and all(g[2] for g in gathered):
        return cache.plan, cache, True, token
    if cache is not None:  # the structure changed on some rank: gather the descriptions now
        try:
            blob, error = pickle.dumps(describe(states), protocol=5), None
        except CheckpointError as e:
            blob, error = None, str(e)
        gathered = comm.all_gather_object((error, blob))
        _raise_first(gathered)
        blobs = [g[1] for g in gathered]
    else:
        blobs = [g[4] for g in gathered]
    payload = None
    if rank == 0:
        try:
            layout = build([pickle.loads(b) for b in blobs], prefix, remove_redundancy)
            payload = (None, pickle.dumps(layout.writes, protocol=5))
        except CheckpointError as e:
            payload = (str(e), None)
    result = comm.all_gather_object(payload)[0]
    if result[0]:
        raise CheckpointError(result[0])
    plan = RankPlan(pickle.loads(result[1])[rank], layout.metadata_bytes if rank == 0 else None)
    return plan, LayoutCache(sig, plan, token), False, token
