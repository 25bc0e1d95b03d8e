"""FSDP gather prefetch on 2 CPU ranks (the end of the 2-rank launch, _prefetch_check.py): the same
training bit for bit, the same bytes in fewer all-gathers (one per unit run), and the order of
issued gathers one unit ahead; with the reduce-scatters bucketed per unit too, the same training
bit for bit in fewer reduce-scatters."""

from __future__ import annotations

import pytest

WORLD = 2


@pytest.fixture(scope="module")
def run(world2):
    if len(world2.by_name("prefetch_done")) != WORLD:
        pytest.fail("the prefetch checks did not finish on every rank\n" + world2.failure_report())
    return world2


@pytest.mark.parametrize("check", ["same_training", "collectives", "order", "scatter_buckets"])
def test_prefetch(run, check):
    found = run.by_name(f"prefetch[{check}]")
    assert {r["rank"] for r in found} == set(range(WORLD)), f"prefetch[{check}]: results from {found}"
    bad = [f"rank {r['rank']}: {r['detail']}" for r in found if not r["ok"]]
    assert not bad, "\n".join(bad)
