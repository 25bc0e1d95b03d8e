"""JSON for common.json: numpy arrays and scalars, bytes and tuples survive the round trip.

RNG states are the usual payload (numpy's MT19937 state is a tuple holding a uint32 array), so
arrays are stored tagged with dtype, shape and base64 data; tuples are tagged so they come back
as tuples. Anything else that JSON cannot hold is refused with its key path.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from .errors import CheckpointError, brief

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


def decode(obj: Any, path: str = "common", where: str = "common.json") -> Any:
    """The inverse of `encode`. A tagged value that does not describe what its tag says (unknown
    dtype, data that does not fill its shape, missing fields, bad base64) is a CheckpointError
    naming `where` (the file) and the key path."""
    if isinstance(obj, list):
        return [decode(v, f"{path}[{i}]", where) for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        tag = obj.get(_TAG)
        if tag is None:
            return {k: decode(v, f"{path}.{k}", where) for k, v in obj.items()}
        if tag == "ndarray":
            return _decode_array(obj, path, where)
        if tag == "bytes":
            _fields(obj, {"data"}, path, where)
            return _b64(obj["data"], path, where)
        if tag == "tuple":
            _fields(obj, {"items"}, path, where)
            if not isinstance(obj["items"], list):
                raise CheckpointError(f"{where}: {path}: a tagged tuple needs a list of items")
            return tuple(decode(v, f"{path}[{i}]", where) for i, v in enumerate(obj["items"]))
        raise CheckpointError(f"{where}: {path}: unknown tag {brief(tag)} (expected ndarray, bytes or tuple)")
    return obj


def _fields(obj: dict, needed: set[str], path: str, where: str) -> None:
    missing = sorted(needed - set(obj))
    if missing:
        raise CheckpointError(f"{where}: {path}: tagged {obj[_TAG]} lacks {missing[0]!r}")


def _b64(data: Any, path: str, where: str) -> bytes:
    if not isinstance(data, str):
        raise CheckpointError(f"{where}: {path}.data: must be a base64 string")
    try:
        return base64.b64decode(data, validate=True)
    except (ValueError, TypeError):
        raise CheckpointError(f"{where}: {path}.data: not valid base64") from None


def _decode_array(obj: dict, path: str, where: str) -> np.ndarray:
    _fields(obj, {"dtype", "shape", "data"}, path, where)
    code, shape = obj["dtype"], obj["shape"]
    try:
        dtype = np.dtype(code) if isinstance(code, str) else None
    except TypeError:
        dtype = None
    # Only plain numeric/bool/bytes dtypes, as encode writes them: never object or structured ones.
    if dtype is None or dtype.hasobject or dtype.fields is not None or dtype.kind not in "biufcSU":
        raise CheckpointError(f"{where}: {path}.dtype: {brief(code)} is not a numpy dtype mf-ckpt stores")
    if not (isinstance(shape, list) and all(type(d) is int and 0 <= d < 2**62 for d in shape)):
        raise CheckpointError(f"{where}: {path}.shape: must be a list of non-negative integers, got {brief(shape)}")
    data = _b64(obj["data"], path, where)
    count = 1
    for d in shape:
        count *= d
    if count * dtype.itemsize != len(data):
        raise CheckpointError(f"{where}: {path}: {len(data)} bytes of data do not fill a {dtype.str}{shape} array "
                              f"({count * dtype.itemsize} bytes)")
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()
