"""`ParallelDims`: the one object that owns the device-mesh arithmetic.

The world is a 5-d mesh, outermost to innermost: pp x dp_replicate x dp_shard x cp x tp. tp is the
innermost axis so that tensor-parallel partners are neighbouring ranks (on one host, on a fast
link); pp is outermost because stages exchange the least. Nothing here touches MindSpore: the
arithmetic is testable anywhere and `mf_parallel.mesh` turns it into communication groups.

Named groups are single axes ("tp", "dp_shard", ...) or flattened combinations the strategies
need: "dp" (dp_replicate x dp_shard: who reads different data), "dp_shard_cp" (the FSDP shard
group: context-parallel ranks hold the same parameters, so they shard them too), "dp_cp" (every
rank whose loss contributes to the global mean), "cp_tp" (the ranks holding pieces of the same
sequences: context-parallel chunks, each split again by sequence parallelism), "ep" and
"dp_shard_mod_ep" (expert parallel carved out of the flattened dp_shard x cp axis).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from mf_parallel.errors import ParallelConfigError

AXES: tuple[str, ...] = ("pp", "dp_replicate", "dp_shard", "cp", "tp")

# Flattened groups: name -> the axes they span (in mesh order).
COMBINED: dict[str, tuple[str, ...]] = {
    "dp": ("dp_replicate", "dp_shard"),
    "dp_shard_cp": ("dp_shard", "cp"),
    "dp_cp": ("dp_replicate", "dp_shard", "cp"),
    "cp_tp": ("cp", "tp"),
}
EXPERT_GROUPS: tuple[str, ...] = ("ep", "dp_shard_mod_ep")
GROUP_NAMES: tuple[str, ...] = (*AXES, *COMBINED, *EXPERT_GROUPS)

# YAML key -> attribute, for the messages: users know the YAML names.
_YAML_KEY = {
    "pp": "pipeline_parallel",
    "dp_shard": "data_parallel_shard",
    "cp": "context_parallel",
    "tp": "tensor_parallel",
    "ep": "expert_parallel",
    "dp_replicate": "data_parallel_replicate",
}


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_degree(name: str, value: Any, allow_auto: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ParallelConfigError(f"parallelism.{_YAML_KEY[name]}: must be an integer, got {value!r}")
    if value == -1 and allow_auto:
        return value
    if value < 1:
        hint = " (or -1 for all remaining ranks)" if allow_auto else ""
        raise ParallelConfigError(f"parallelism.{_YAML_KEY[name]}: must be a positive integer{hint}, got {value}")
    return value


@dataclass(frozen=True)
class ParallelDims:
    """Degrees of every parallel axis for `world_size` ranks.

    `dp_shard=-1` takes every rank the other axes leave (pure FSDP when dp_replicate is 1).
    A YAML `parallelism` section becomes one through `mf_parallel.Layout.resolve` (layout.py).
    """

    world_size: int
    dp_replicate: int = 1
    dp_shard: int = -1
    cp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    _strides: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int) or self.world_size < 1:
            raise ParallelConfigError(f"world size must be a positive integer, got {self.world_size!r}")
        for name in ("dp_replicate", "cp", "tp", "pp", "ep"):
            check_degree(name, getattr(self, name))
        check_degree("dp_shard", self.dp_shard, allow_auto=True)
        others = self.pp * self.dp_replicate * self.cp * self.tp
        if self.dp_shard == -1:
            if self.world_size % others:
                raise ParallelConfigError(
                    f"parallelism: pipeline_parallel ({self.pp}) x data-parallel replicas ({self.dp_replicate}) x "
                    f"context_parallel ({self.cp}) x tensor_parallel ({self.tp}) = {others} does not divide the world "
                    f"size {self.world_size}; pick degrees whose product divides {self.world_size}")
            object.__setattr__(self, "dp_shard", self.world_size // others)
        product = others * self.dp_shard
        if product != self.world_size:
            raise ParallelConfigError(
                f"parallelism: pp {self.pp} x dp_replicate {self.dp_replicate} x dp_shard {self.dp_shard} x cp "
                f"{self.cp} x tp {self.tp} = {product}, but the world has {self.world_size} ranks; make the product "
                f"equal the world size (data_parallel_shard: -1 fills the rest)")
        if (self.dp_shard * self.cp) % self.ep:
            options = [d for d in divisors(self.dp_shard * self.cp)]
            raise ParallelConfigError(
                f"parallelism.expert_parallel: {self.ep} does not divide data_parallel_shard x context_parallel = "
                f"{self.dp_shard} x {self.cp} = {self.dp_shard * self.cp}; use one of {options}")
        strides, stride = {}, 1
        for axis in reversed(AXES):
            strides[axis] = stride
            stride *= getattr(self, axis)
        object.__setattr__(self, "_strides", strides)

    # ----------------------------------------------------------------- derived sizes and flags
    @property
    def dp(self) -> int:
        """Data-parallel size: how many different micro-batches one step reads."""
        return self.dp_replicate * self.dp_shard

    @property
    def fsdp_enabled(self) -> bool:
        return self.dp_shard * self.cp > 1

    @property
    def hsdp_enabled(self) -> bool:
        return self.dp_replicate > 1 and self.dp_shard > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def sp_enabled(self) -> bool:
        """Sequence parallelism is on whenever tensor parallelism is (it cannot be switched off)."""
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def cp_enabled(self) -> bool:
        return self.cp > 1

    @property
    def ep_enabled(self) -> bool:
        return self.ep > 1

    def size(self, name: str) -> int:
        """Number of ranks in one group called `name` (an axis or a combined group)."""
        if name in AXES:
            return getattr(self, name)
        if name in COMBINED:
            return math.prod(getattr(self, a) for a in COMBINED[name])
        if name == "ep":
            return self.ep
        if name == "dp_shard_mod_ep":
            return self.dp_shard * self.cp // self.ep
        raise ParallelConfigError(f"unknown group {name!r}; known: {', '.join(GROUP_NAMES)}")

    # ----------------------------------------------------------------- rank <-> coordinates
    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ParallelConfigError(f"rank {rank} is outside the world of {self.world_size} ranks")

    def coords(self, rank: int) -> dict[str, int]:
        """The mesh coordinates of `rank`, one per axis in AXES."""
        self._check_rank(rank)
        return {axis: (rank // self._strides[axis]) % getattr(self, axis) for axis in AXES}

    def rank_of(self, **coords: int) -> int:
        """Inverse of `coords` (missing axes are 0)."""
        rank = 0
        for axis, value in coords.items():
            if axis not in AXES:
                raise ParallelConfigError(f"unknown mesh axis {axis!r}; axes are {', '.join(AXES)}")
            if not 0 <= value < getattr(self, axis):
                raise ParallelConfigError(f"coordinate {axis}={value} outside 0..{getattr(self, axis) - 1}")
            rank += value * self._strides[axis]
        return rank

    def dp_rank(self, rank: int) -> int:
        """Index of `rank`'s micro-batch among the dp data-parallel ones (what the data loader shards by)."""
        c = self.coords(rank)
        return c["dp_replicate"] * self.dp_shard + c["dp_shard"]

    def coordinate(self, name: str, rank: int) -> int:
        """Position of `rank` inside its group `name` (the group rank)."""
        return self.group_ranks(name, rank).index(rank)

    def group_ranks(self, name: str, rank: int) -> list[int]:
        """World ranks of the group `name` that contains `rank`, in group-rank order."""
        c = self.coords(rank)
        if name in AXES or name in COMBINED:
            span = (name,) if name in AXES else COMBINED[name]
            fixed = {a: v for a, v in c.items() if a not in span}
            base = sum(v * self._strides[a] for a, v in fixed.items())
            # itertools.product varies its last factor fastest: group ranks follow mesh order.
            return [base + sum(i * self._strides[a] for a, i in zip(span, idx))
                    for idx in itertools.product(*(range(getattr(self, a)) for a in span))]
        if name in EXPERT_GROUPS:
            block = self.group_ranks("dp_shard_cp", rank)  # flattened dp_shard x cp, cp fastest
            pos = block.index(rank)
            if name == "ep":
                start = pos - pos % self.ep
                return block[start:start + self.ep]
            return block[pos % self.ep::self.ep]
        raise ParallelConfigError(f"unknown group {name!r}; known: {', '.join(GROUP_NAMES)}")

    def cp_subgroup_ranks(self, name: str, rank: int, ulysses_degree: int) -> list[int]:
        """World ranks of `rank`'s hybrid context-parallel sub-group: "cp_ulysses" (ulysses_degree
        neighbouring cp ranks, the all-to-all group) or "cp_ring" (every ulysses_degree-th cp rank,
        the ring across those groups), in group-rank order."""
        if ulysses_degree < 1 or self.cp % ulysses_degree:
            raise ParallelConfigError(
                f"parallelism.ulysses_degree_in_cp: {ulysses_degree} does not divide context_parallel {self.cp}; "
                f"use one of {divisors(self.cp)}")
        cp_ranks = self.group_ranks("cp", rank)
        pos = cp_ranks.index(rank)
        if name == "cp_ulysses":
            start = pos - pos % ulysses_degree
            return cp_ranks[start:start + ulysses_degree]
        if name == "cp_ring":
            return cp_ranks[pos % ulysses_degree::ulysses_degree]
        raise ParallelConfigError(f"unknown context-parallel sub-group {name!r}; known: cp_ulysses, cp_ring")

    def all_groups(self, name: str) -> list[list[int]]:
        """Every group called `name`: a partition of the world."""
        seen: dict[int, list[int]] = {}
        for rank in range(self.world_size):
            ranks = self.group_ranks(name, rank)
            seen.setdefault(ranks[0], ranks)
        return list(seen.values())

    # ----------------------------------------------------------------- model-dependent checks
    def check_heads(self, num_heads: int, num_kv_heads: int | None = None) -> None:
        """Raise unless tensor_parallel divides the attention (and key/value) head counts."""
        kv = num_heads if num_kv_heads is None else num_kv_heads
        for label, count in (("num_attention_heads", num_heads), ("num_key_value_heads", kv)):
            if count % self.tp:
                options = [d for d in divisors(math.gcd(num_heads, kv)) if self.world_size % d == 0]
                raise ParallelConfigError(
                    f"parallelism.tensor_parallel: {self.tp} does not divide model.{label} = {count}; use a "
                    f"tensor_parallel that divides both head counts: one of {options}")

    def local_heads(self, num_heads: int) -> int:
        """Heads held by one tensor-parallel rank (checks divisibility)."""
        if num_heads % self.tp:
            raise ParallelConfigError(
                f"parallelism.tensor_parallel: {self.tp} does not divide {num_heads} heads; "
                f"use one of {divisors(num_heads)}")
        return num_heads // self.tp

    def describe(self) -> str:
        """One line for logs: every degree and the strategies they switch on."""
        parts = [f"{a}={getattr(self, a)}" for a in AXES] + [f"ep={self.ep}"]
        modes = [m for m, on in (("HSDP" if self.hsdp_enabled else "FSDP", self.fsdp_enabled),
                                 ("DDP", self.dp_replicate > 1 and not self.fsdp_enabled),
                                 ("TP+SP", self.tp_enabled), ("PP", self.pp_enabled), ("CP", self.cp_enabled),
                                 ("EP", self.ep_enabled)) if on]
        return f"world={self.world_size} " + " ".join(parts) + (f" ({', '.join(modes)})" if modes else " (single rank)")
