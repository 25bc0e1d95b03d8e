"""ParallelDims: mesh arithmetic, named groups, and every layout error (the YAML block: test_layout.py)."""

from __future__ import annotations

import itertools

import pytest

from mf_parallel import GROUP_NAMES, ParallelConfigError, ParallelDims

LAYOUTS = [
    dict(world_size=1),
    dict(world_size=8),
    dict(world_size=8, tp=2),
    dict(world_size=8, dp_replicate=2, dp_shard=2, tp=2),
    dict(world_size=16, pp=2, dp_replicate=2, cp=2, tp=2),
    dict(world_size=12, dp_shard=3, cp=2, tp=2, ep=2),
    dict(world_size=8, dp_shard=4, cp=2, ep=8),
]


@pytest.mark.parametrize("kw", LAYOUTS)
def test_coords_roundtrip_and_product(kw):
    dims = ParallelDims(**kw)
    assert dims.pp * dims.dp_replicate * dims.dp_shard * dims.cp * dims.tp == dims.world_size
    seen = set()
    for rank in range(dims.world_size):
        c = dims.coords(rank)
        assert dims.rank_of(**c) == rank
        seen.add(tuple(c.values()))
    assert len(seen) == dims.world_size


@pytest.mark.parametrize("kw", LAYOUTS)
@pytest.mark.parametrize("name", GROUP_NAMES)
def test_every_group_name_partitions_the_world(kw, name):
    dims = ParallelDims(**kw)
    groups = dims.all_groups(name)
    flat = sorted(itertools.chain.from_iterable(groups))
    assert flat == list(range(dims.world_size))
    assert all(len(g) == dims.size(name) for g in groups)
    for rank in range(dims.world_size):
        ranks = dims.group_ranks(name, rank)
        assert rank in ranks and dims.coordinate(name, rank) == ranks.index(rank)


def test_tp_is_innermost_and_groups_vary_only_their_axes():
    dims = ParallelDims(8, dp_replicate=2, dp_shard=2, tp=2)
    assert dims.all_groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert dims.all_groups("dp_shard") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert dims.all_groups("dp_replicate") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert dims.all_groups("dp") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    for rank in range(8):
        c = dims.coords(rank)
        for other in dims.group_ranks("dp", rank):
            o = dims.coords(other)
            assert (o["tp"], o["pp"], o["cp"]) == (c["tp"], c["pp"], c["cp"])


def test_combined_groups_flatten_their_axes():
    dims = ParallelDims(16, dp_replicate=2, dp_shard=2, cp=2, tp=2)
    assert dims.size("dp_shard_cp") == 4 and dims.size("dp_cp") == 8 and dims.size("dp") == 4
    # dp_shard_cp of rank 0: dp_shard in {0,1} x cp in {0,1}, tp fixed at 0
    assert dims.group_ranks("dp_shard_cp", 0) == [0, 2, 4, 6]


def test_expert_groups_split_dp_shard_cp():
    dims = ParallelDims(8, dp_shard=4, cp=2, ep=4)
    assert dims.all_groups("ep") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert dims.all_groups("dp_shard_mod_ep") == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_dp_rank_orders_replicas_then_shards():
    dims = ParallelDims(8, dp_replicate=2, dp_shard=2, tp=2)
    assert [dims.dp_rank(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_flags():
    assert ParallelDims(8, dp_replicate=2, dp_shard=4).hsdp_enabled
    dims = ParallelDims(4, dp_replicate=4, dp_shard=1)
    assert not dims.fsdp_enabled and "DDP" in dims.describe()
    tp = ParallelDims(2, tp=2)
    assert tp.tp_enabled and tp.sp_enabled and not tp.fsdp_enabled
    assert ParallelDims(1).describe().endswith("(single rank)")


def test_explicit_product_mismatch_says_how_to_fix():
    with pytest.raises(ParallelConfigError, match="= 4, but the world has 8 ranks; make the product equal"):
        ParallelDims(8, dp_replicate=2, dp_shard=2)


def test_ep_error_lists_valid_degrees():
    with pytest.raises(ParallelConfigError, match=r"use one of \[1, 2, 4\]"):
        ParallelDims(4, ep=3)


def test_heads_must_divide_by_tp():
    dims = ParallelDims(8, tp=4)
    dims.check_heads(8, 4)
    assert dims.local_heads(8) == 2
    with pytest.raises(ParallelConfigError, match=r"does not divide model.num_attention_heads = 6; .* one of \[1, 2\]"):
        dims.check_heads(6, 2)
    with pytest.raises(ParallelConfigError, match="does not divide model.num_key_value_heads = 2"):
        dims.check_heads(8, 2)


def test_rank_and_coordinate_bounds():
    dims = ParallelDims(4, tp=2)
    with pytest.raises(ParallelConfigError, match="rank 4 is outside the world of 4 ranks"):
        dims.coords(4)
    with pytest.raises(ParallelConfigError, match="coordinate tp=2 outside 0..1"):
        dims.rank_of(tp=2)
    with pytest.raises(ParallelConfigError, match="unknown group 'tensor'"):
        dims.group_ranks("tensor", 0)
