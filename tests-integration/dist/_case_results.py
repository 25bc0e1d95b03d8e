"""What the Trainer cases of _trainer_worker.py leave on disk, read the same way by every parity test."""

from __future__ import annotations

import json

import numpy as np


def case_result(workdir, name) -> dict:
    """Rank 0's result.json of case `name` (losses, grad norms, mode, ...)."""
    path = workdir / name / "result.json"
    assert path.exists(), f"{name}: no result.json (rank 0 did not finish the case)"
    return json.loads(path.read_text())


def case_weights(workdir, name) -> dict:
    """The final gathered weights of case `name`."""
    with np.load(workdir / name / "weights.npz") as f:
        return {k: f[k] for k in f.files}


def rel_err(a, b) -> float:
    """Largest relative difference of a against b (same shapes)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-12)))
