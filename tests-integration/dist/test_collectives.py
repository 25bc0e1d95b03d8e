"""Every collective, on every group shape of a 2x2 layout, under msrun on 4 CPU ranks (the 4-rank
launch, shared with the 4-rank Trainer cases: see conftest.py)."""

from __future__ import annotations

import pytest

WORLD = 4


@pytest.fixture(scope="module")
def run(world4):
    return world4


def _check(run, prefix: str) -> None:
    found = [r for r in run.results if r["name"].startswith(prefix)]
    assert found, f"no results named {prefix}*"
    bad = [f"rank {r['rank']} {r['name']}: {r['detail']}" for r in found if not r["ok"]]
    assert not bad, "\n".join(bad)
    per_rank = {r["rank"] for r in found}
    assert per_rank == set(range(WORLD)), f"{prefix}: results from ranks {sorted(per_rank)} only"


@pytest.mark.parametrize("prefix", [
    "all_reduce[", "all_gather[", "reduce_scatter[", "all_to_all[", "all_to_all_v[", "broadcast[", "barrier[",
    "send_recv[",
])
def test_collective_matches_numpy(run, prefix):
    _check(run, prefix)


@pytest.mark.parametrize("prefix", ["autograd[", "counter[", "communicator", "native_equals_emulated",
                                    "emulation_logged_once"])
def test_collective_machinery(run, prefix):
    _check(run, prefix)


def test_capability_table_matches_mindspore(run):
    """What the README's table says MCCL lacks still fails, and what it says works, works."""
    _check(run, "capability[")


def test_rank0_streamed_to_console(run):
    assert "RESULT" in run.console and '"name": "done"' in run.console
