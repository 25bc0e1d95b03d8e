"""JSON for common.json: numpy arrays and scalars, bytes and tuples survive the round trip.

RNG states are the usual payload (numpy's MT19937 state is a tuple holding a uint32 array), so
arrays are stored tagged with dtype, shape and base64 data; tuples are tagged so they come back
as tuples. Anything else that JSON cannot hold is refused with its key path.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from .errors import CheckpointError

_TAG = "__mf__"


def encode(obj: Any, path: str = "common") -> Any:
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, (int, float)) and not isinstance(obj, np.generic):
        return obj
    if isinstance(obj, np.generic):
        return encode(obj.item(), path) if obj.dtype.kind in "biuf" else encode(np.asarray(obj), path)
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        if arr.dtype.hasobject:
            raise CheckpointError(f"{path}: object arrays cannot be stored in common.json")
        return {_TAG: "ndarray", "dtype": arr.dtype.str, "shape": list(arr.shape),
                "data": base64.b64encode(arr.tobytes()).decode("ascii")}
    if isinstance(obj, (bytes, bytearray)):
        return {_TAG: "bytes", "data": base64.b64encode(bytes(obj)).decode("ascii")}
    if isinstance(obj, tuple):
        return {_TAG: "tuple", "items": [encode(v, f"{path}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [encode(v, f"{path}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, str):
                raise CheckpointError(f"{path}: keys must be strings, got {k!r}")
            out[k] = encode(v, f"{path}.{k}")
        return out
    raise CheckpointError(f"{path}: {type(obj).__name__} cannot be stored in common.json")


def decode(obj: Any) -> Any:
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    if isinstance(obj, dict):
        tag = obj.get(_TAG)
        if tag == "ndarray":
            data = base64.b64decode(obj["data"])
            return np.frombuffer(data, dtype=np.dtype(obj["dtype"])).reshape(obj["shape"]).copy()
        if tag == "bytes":
            return base64.b64decode(obj["data"])
        if tag == "tuple":
            return tuple(decode(v) for v in obj["items"])
        return {k: decode(v) for k, v in obj.items()}
    return obj
