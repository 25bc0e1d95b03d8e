"""Communication groups for a `ParallelDims`, created once per process.

A `Group` is a plain description (backend group name, member world ranks, this rank's index) that
collective Cells read at construction time, so nothing here is touched inside compiled graphs.
Groups of one rank have no backend group at all: every collective on them is the identity and
costs nothing. A group holding every rank is the backend's world group, because some CPU
primitives (AllGather, Broadcast) work only there. Two names with the same members (e.g. "dp" and
"dp_shard" when dp_replicate is 1) share one backend group.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

from mf_parallel.backend import backend_name, init_distributed, world_group_name
from mf_parallel.dims import GROUP_NAMES, ParallelDims
from mf_parallel.errors import ParallelConfigError

log = logging.getLogger("mf_parallel")


@dataclass(frozen=True)
class Group:
    """One communication group as seen from this rank."""

    label: str                 # logical name for logs ("tp", "dp_shard_cp", "p2p", ...)
    ranks: tuple[int, ...]     # member world ranks, in group-rank order
    rank: int                  # this process's index in `ranks`
    name: str                  # backend group name ("" for a single-rank group)
    backend: str               # "mccl" | "hccl" | "nccl"
    is_world: bool

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def world_rank(self) -> int:
        return self.ranks[self.rank]


_CREATED: dict[tuple[int, ...], str] = {}


def _backend_group_name(ranks: tuple[int, ...]) -> str:
    joined = "mf_" + "_".join(map(str, ranks))
    if len(joined) <= 64:
        return joined
    return "mf_" + hashlib.sha1(",".join(map(str, ranks)).encode()).hexdigest()[:20]


def make_group(label: str, ranks: list[int] | tuple[int, ...], name: str | None = None) -> Group:
    """The group `ranks` (this rank must be a member), creating the backend group on first use.

    Group creation is collective among the members: every member must call this for the same
    `ranks` in the same order relative to its other group creations. `name` (default: derived from
    the ranks) must be the same on every member.
    """
    my_rank, world = init_distributed()
    ranks = tuple(int(r) for r in ranks)
    if my_rank not in ranks:
        raise ParallelConfigError(f"rank {my_rank} is not a member of group {label} {list(ranks)}")
    if len(set(ranks)) != len(ranks) or not all(0 <= r < world for r in ranks):
        raise ParallelConfigError(f"group {label}: ranks {list(ranks)} must be distinct ranks of the world 0..{world - 1}")
    backend = backend_name() if world > 1 else "mccl"
    if len(ranks) == 1:
        name = ""
    elif ranks == tuple(range(world)):
        name = world_group_name()
    else:
        existing = _CREATED.get(ranks)
        if existing is not None:
            name = existing
        else:
            from mindspore.communication import create_group

            name = name or _backend_group_name(ranks)
            create_group(name, list(ranks))
            _CREATED[ranks] = name
            log.debug("created group %s = %s", name, list(ranks))
    is_world = world > 1 and len(ranks) == world and name == world_group_name()
    return Group(label=label, ranks=ranks, rank=ranks.index(my_rank), name=name, backend=backend, is_world=is_world)


class DeviceMesh:
    """The groups of every axis and combined axis of `dims`, for this rank."""

    def __init__(self, dims: ParallelDims) -> None:
        rank, world = init_distributed()
        if world != dims.world_size:
            raise ParallelConfigError(
                f"the layout is for {dims.world_size} ranks but {world} were started; launch with "
                f"-n {dims.world_size} or change the parallelism degrees")
        self.dims = dims
        self.rank = rank
        self.world_size = world
        self.coords = dims.coords(rank)
        # Deterministic creation order on every rank: GROUP_NAMES order. Backend names say the role,
        # not the ranks, so that every rank's compiled graph carries the same group names: a compiled
        # step's collective order can otherwise differ between ranks (seen under FSDP x TP).
        layout = self._layout = f"p{dims.pp}r{dims.dp_replicate}s{dims.dp_shard}c{dims.cp}t{dims.tp}e{dims.ep}"
        self._groups = {name: make_group(name, dims.group_ranks(name, rank), f"mf_{name}_{layout}")
                        for name in GROUP_NAMES}
        self._groups["world"] = make_group("world", list(range(world)))

    def cp_subgroups(self, ulysses_degree: int) -> tuple[Group, Group]:
        """(Ulysses group, ring group) splitting this rank's cp group for hybrid context parallelism
        (`ParallelDims.cp_subgroup_ranks`), created on first use (every rank: Ulysses group first)."""
        names = (f"cp_ulysses{ulysses_degree}", f"cp_ring{ulysses_degree}")
        if names[0] not in self._groups:
            for name, kind in zip(names, ("cp_ulysses", "cp_ring")):
                ranks = self.dims.cp_subgroup_ranks(kind, self.rank, ulysses_degree)
                self._groups[name] = make_group(name, ranks, f"mf_{name}_{self._layout}")
        return self._groups[names[0]], self._groups[names[1]]

    def __getitem__(self, name: str) -> Group:
        try:
            return self._groups[name]
        except KeyError:
            raise ParallelConfigError(f"unknown group {name!r}; known: {', '.join(self._groups)}") from None

    def group(self, name: str) -> Group:
        return self[name]

    def __repr__(self) -> str:
        return f"DeviceMesh(rank={self.rank}, {self.dims.describe()})"


_MESHES: dict[ParallelDims, DeviceMesh] = {}


def init_mesh(dims: ParallelDims) -> DeviceMesh:
    """The `DeviceMesh` of `dims`, built (and its groups created) only on the first call."""
    mesh = _MESHES.get(dims)
    if mesh is None:
        mesh = _MESHES[dims] = DeviceMesh(dims)
        log.info("parallel layout: %s", dims.describe())
    return mesh

