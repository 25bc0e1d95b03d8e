"""msrun starts real CPU ranks that can talk: the ground every dist test stands on."""

from pathlib import Path

WORKER = Path(__file__).with_name("_allreduce_worker.py")


def test_two_ranks_all_reduce(msrun):
    logs = msrun(WORKER, 2)
    for rank, log in enumerate(logs):
        assert f"RESULT rank={rank} world=2 value=3.0" in log
