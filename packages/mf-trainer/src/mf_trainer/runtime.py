"""Process-wide MindSpore setup: device, execution mode, seeds, determinism, RNG snapshots.

`context.device_target: null` picks Ascend when MindSpore sees one, else CPU. `context.mode` 0
compiles the training step whole in GRAPH_MODE (the fast path); 1 runs it op by op in PyNative
(the debugging path). The RNG state of Python, numpy and MindSpore's default generator is saved
in every checkpoint and restored on resume, as plain JSON data (numbers and lists): nothing read
from a checkpoint is unpickled, so opening one someone sent you cannot run their code.

    "rng": {"python": {"version": 3, "state": [625 ints], "gauss_next": null},
            "numpy": {"bit_generator": "MT19937", "keys": [624 ints], "pos": 624, "has_gauss": 0,
                      "cached_gaussian": 0.0},
            "mindspore": [uint8 ...]}

mf-trainer before 0.4 stored the Python and numpy states pickled (base64 strings): such a state is
refused, never unpickled (`checkpoint.load_rng_state: false` resumes without it).
"""

from __future__ import annotations

import logging
import random

import mindspore as ms
import numpy as np

from mf_trainer.environment import world_size_from_env  # noqa: F401  (re-exported)
from mf_trainer.errors import TrainerConfigError

log = logging.getLogger("mf_trainer")


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
    """JSON data of every RNG the loop can touch (written to common.json)."""
    version, internal, gauss_next = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": {"version": int(version), "state": [int(x) for x in internal], "gauss_next": gauss_next},
        "numpy": {"bit_generator": str(kind), "keys": [int(x) for x in keys], "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "mindspore": ms.get_rng_state().asnumpy().tolist(),
    }


class RNGStateError(ValueError):
    """An RNG state in a checkpoint that cannot be restored: one line starting with the field
    (`rng.numpy.keys: ...`), without the file, which the caller names."""


PICKLED_RNG = ("rng: stored pickled (written by mf-trainer < 0.4), which is never unpickled (a pickle can run code); "
               "resume without it with checkpoint.load_rng_state: false (the RNGs restart from training.seed)")


def _ints(value, count: int | None, what: str, limit: int | None = None) -> list[int]:
    """`value` as a list of `count` ints (each below `limit` when given), else RNGStateError."""
    if not isinstance(value, list) or (count is not None and len(value) != count) or \
            not all(type(x) is int and x >= 0 and (limit is None or x < limit) for x in value):
        size = f"{count} " if count is not None else ""
        bound = f" in [0, {limit})" if limit is not None else " >= 0"
        raise RNGStateError(f"rng.{what}: must be a list of {size}integers{bound}")
    return value


def set_rng_state(state) -> None:
    """Restore `rng_state()`'s data; RNGStateError for anything else (a pickled state included).
    Everything is checked before any generator is touched."""
    if state is None:
        raise RNGStateError("rng: missing (needed to resume exactly; checkpoint.load_rng_state: false resumes "
                            "without it)")
    if not isinstance(state, dict):
        raise RNGStateError(f"rng: must be an object with python, numpy and mindspore states, got "
                            f"{type(state).__name__}")
    if not {"python", "numpy", "mindspore"} <= set(state):
        raise RNGStateError("rng: must hold python, numpy and mindspore states")
    if isinstance(state["python"], str) or isinstance(state["numpy"], str):
        raise RNGStateError(PICKLED_RNG)
    py, npy = state["python"], state["numpy"]
    if not isinstance(py, dict) or not isinstance(npy, dict):
        raise RNGStateError("rng: python and numpy states must be JSON objects")
    gauss = py.get("gauss_next")
    if gauss is not None and not isinstance(gauss, float):
        raise RNGStateError("rng.python.gauss_next: must be a number or null")
    expected = int(ms.get_rng_state().asnumpy().size)
    try:
        python = (int(py["version"]), tuple(_ints(py.get("state"), 625, "python.state", 2 ** 32)), gauss)
        numpy_state = (str(npy["bit_generator"]), np.asarray(_ints(npy.get("keys"), 624, "numpy.keys", 2 ** 32),
                                                             dtype=np.uint32),
                       int(npy["pos"]), int(npy["has_gauss"]), float(npy["cached_gaussian"]))
        mindspore = np.asarray(_ints(state["mindspore"], expected, "mindspore", 256), dtype=np.uint8)
        random.setstate(python)
        np.random.set_state(numpy_state)
    except RNGStateError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise RNGStateError(f"rng: not a state mf-trainer wrote ({type(exc).__name__}: {exc})") from None
    ms.set_rng_state(ms.Tensor(mindspore))
