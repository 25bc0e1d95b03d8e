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


def assert_same_evaluations(got: dict, want: dict, rtol: float = 1e-5) -> None:
    """The evaluations during training of case `got` (a layout) are those of `want` (one process):
    same steps (every EVAL_INTERVAL), same token count, eval loss and accuracy within rtol."""
    from _trainer_worker import EVAL_INTERVAL, STEPS

    steps = [e["step"] for e in want["evaluations"]]
    assert steps == list(range(EVAL_INTERVAL, STEPS + 1, EVAL_INTERVAL)), want["evaluations"]
    assert [e["step"] for e in got["evaluations"]] == steps, got["evaluations"]
    for have, ref in zip(got["evaluations"], want["evaluations"]):
        assert have["eval_tokens"] == ref["eval_tokens"] > 0, (have, ref)
        err = rel_err([have["eval_loss"], have["eval_accuracy"]], [ref["eval_loss"], ref["eval_accuracy"]])
        print(f"\n{got['dims']}: eval at step {have['step']}: loss {have['eval_loss']:.7f} vs one process "
              f"{ref['eval_loss']:.7f} (rel err {err:.1e}), accuracy {have['eval_accuracy']:.4f}")
        assert err <= rtol, f"{got['dims']}: step {have['step']}: {have} vs one process {ref} (rel err {err:.2e})"


def check_param_norms(ref: dict, got: dict, rtol: float) -> None:
    """monitor.train_state.local_norm ('.' in every case): each parameter's whole gradient norm
    (its shards combined over the FSDP / TP / HSDP / CP / pipeline ranks) is one process's. At step
    1 (same weights) every one agrees within rtol; later steps carry the trajectory's rounding, so
    they are held to rtol of the step's global norm (the key biases' tiny gradients are mostly
    rounding: see KEY_BIAS_ATOL in test_trainer_parity.py). Returns nothing; asserts."""
    want, have = ref["param_norms"], got["param_norms"]
    assert set(have) == set(want) and len(want) > 10, f"{got['dims']}: {sorted(have)}"
    first = [name for name in want if not name.endswith("attention.wk.bias")]
    err = rel_err([have[n][0] for n in first], [want[n][0] for n in first])
    assert err <= rtol, f"{got['dims']}: per-parameter norms at step 1, rel err {err:.2e}"
    scale = np.asarray(ref["grad_norms"])
    for name in want:
        gap = np.abs(np.asarray(have[name]) - np.asarray(want[name]))
        assert np.all(gap <= rtol * scale), f"{got['dims']}: grad_norm/{name} {have[name]} vs {want[name]}"
