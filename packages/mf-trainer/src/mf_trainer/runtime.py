"""Process-wide MindSpore setup: device, execution mode, seeds, determinism, RNG snapshots.

`context.device_target: null` picks Ascend when MindSpore sees one, else CPU. `context.mode` 0
compiles the training step whole in GRAPH_MODE (the fast path); 1 runs it op by op in PyNative
(the debugging path). The RNG state of Python, numpy and MindSpore's default generator is saved
in every checkpoint and restored on resume.
"""

from __future__ import annotations

import base64
import logging
import os
import pickle
import random

import mindspore as ms
import numpy as np

from mf_trainer.errors import TrainerConfigError

log = logging.getLogger("mf_trainer")


def world_size_from_env() -> int:
    """Ranks of this job as the launchers announce them (msrun sets RANK_SIZE / MS_WORKER_NUM)."""
    for name in ("MS_WORKER_NUM", "RANK_SIZE", "WORLD_SIZE"):
        value = os.environ.get(name)
        if value and value.isdigit():
            return int(value)
    return 1


def resolve_device(requested: str | None) -> str:
    """The device this run uses; an unavailable explicit request is a config error."""
    if requested is None:
        return "Ascend" if ms.hal.is_available("Ascend") else "CPU"
    if requested != "CPU" and not ms.hal.is_available(requested):
        raise TrainerConfigError(f"context.device_target: {requested} is not available to this MindSpore "
                                 "(use CPU or leave it null for auto)")
    return requested


def setup_context(device: str, mode: int, device_id: int, deterministic: bool) -> None:
    kwargs = {"device_target": device, "mode": ms.GRAPH_MODE if mode == 0 else ms.PYNATIVE_MODE}
    if device != "CPU":
        kwargs["device_id"] = device_id
    ms.set_context(**kwargs)
    use_pynative(mode == 1)
    # Also set when False: a previous Trainer in this process may have turned it on.
    ms.set_context(deterministic="ON" if deterministic else "OFF")


def use_pynative(on: bool = True) -> None:
    """PyNative for training, launched synchronously: MindSpore's asynchronous op pipeline costs
    more than it saves for a training step's many small ops on a few busy cores (measured here:
    tiny llama 2.7 s -> 0.25 s per step, 20M llama 16 s -> 8 s under load)."""
    if on:
        ms.set_context(mode=ms.PYNATIVE_MODE, pynative_synchronize=True)
    else:
        ms.set_context(pynative_synchronize=False)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    ms.set_seed(seed)


def rng_state() -> dict:
    """JSON-able snapshot of every RNG the loop can touch (written to common.json)."""
    return {
        "python": base64.b64encode(pickle.dumps(random.getstate())).decode("ascii"),
        "numpy": base64.b64encode(pickle.dumps(np.random.get_state())).decode("ascii"),
        "mindspore": ms.get_rng_state().asnumpy().tolist(),
    }


def rng_state_problem(state) -> str | None:
    """What is wrong with a saved RNG state (e.g. `.numpy: not base64`), None if it can be
    restored; nothing is decoded beyond base64 here."""
    if not isinstance(state, dict):
        return f": must be an object with python, numpy and mindspore states, got {type(state).__name__}"
    for key in ("python", "numpy"):
        value = state.get(key)
        if not isinstance(value, str):
            return f".{key}: missing or not a string"
        try:
            base64.b64decode(value, validate=True)
        except ValueError:
            return f".{key}: not valid base64"
    value = state.get("mindspore")
    expected = int(ms.get_rng_state().asnumpy().size)
    if not (isinstance(value, list) and len(value) == expected
            and all(type(v) is int and 0 <= v < 256 for v in value)):
        return f".mindspore: must be a list of {expected} byte values"
    return None


def set_rng_state(state: dict, where: str = "checkpoint common.json") -> None:
    try:
        python, numpy_state = (pickle.loads(base64.b64decode(state[k])) for k in ("python", "numpy"))
        random.setstate(python)
        np.random.set_state(numpy_state)
    except Exception as exc:  # whatever a damaged payload raises: a bad file, not a crash
        raise TrainerConfigError(f"{where}: rng: cannot be restored ({type(exc).__name__})") from None
    ms.set_rng_state(ms.Tensor(np.asarray(state["mindspore"], dtype=np.uint8)))
