"""What the launcher tells this process about the job, read without MindSpore."""

from __future__ import annotations

import os


def world_size_from_env() -> int:
    """Ranks of this job as the launchers announce them (msrun sets RANK_SIZE / MS_WORKER_NUM)."""
    for name in ("MS_WORKER_NUM", "RANK_SIZE", "WORLD_SIZE"):
        value = os.environ.get(name)
        if value and value.isdigit():
            return int(value)
    return 1
