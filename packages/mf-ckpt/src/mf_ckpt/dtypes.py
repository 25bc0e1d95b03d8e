"""safetensors dtype codes <-> numpy dtypes, including the ones numpy lacks.

numpy has no bfloat16 or float8, and `safetensors.numpy` refuses them, yet most Hugging Face
checkpoints are BF16. mf-ckpt carries such tensors bit-exactly as numpy *structured* dtypes of one
unsigned field (`BF16 = dtype([("bf16", "<u2")])`): they slice, stack, copy and save like any array,
arithmetic on them fails loudly instead of silently computing on integers, and `to_float32` /
`bf16_from_float32` convert. Arrays typed with `ml_dtypes` (JAX's bfloat16/float8) map to the same
codes by dtype name; that path is not exercised by the tests, which run without ml_dtypes.
"""

from __future__ import annotations

import numpy as np

from .errors import CheckpointError

_NATIVE: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}

BF16 = np.dtype([("bf16", "<u2")])
F8_E4M3 = np.dtype([("f8_e4m3", "u1")])
F8_E5M2 = np.dtype([("f8_e5m2", "u1")])
_RAW: dict[str, np.dtype] = {"BF16": BF16, "F8_E4M3": F8_E4M3, "F8_E5M2": F8_E5M2}
# Names of the same formats in ml_dtypes (accepted from callers, bit-identical).
_FOREIGN = {"bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}

CODES = tuple(_NATIVE) + tuple(_RAW)


def numpy_dtype(code: str) -> np.dtype:
    """The numpy dtype mf-ckpt uses for a safetensors dtype code."""
    if code in _NATIVE:
        return _NATIVE[code]
    if code in _RAW:
        return _RAW[code]
    raise CheckpointError(f"unsupported safetensors dtype {code!r} (supported: {', '.join(CODES)})")


def is_raw(code: str) -> bool:
    """True for formats numpy cannot compute with (carried as structured raw bits)."""
    return code in _RAW


def itemsize(code: str) -> int:
    return numpy_dtype(code).itemsize


_CODE_CACHE: dict[np.dtype, str] = {}


def code_of(dtype) -> str:
    """The safetensors code of a numpy dtype (raises CheckpointError if it has none)."""
    code = _CODE_CACHE.get(dtype)  # called per tensor on hot paths: memoise
    if code is None:
        code = _CODE_CACHE[dtype] = _code_of(np.dtype(dtype))
    return code


def _code_of(dt: np.dtype) -> str:
    for code, raw in _RAW.items():
        if dt == raw:
            return code
    if dt.name in _FOREIGN:
        return _FOREIGN[dt.name]
    if dt.byteorder == ">":
        raise CheckpointError(f"big-endian dtype {dt} is not supported (safetensors is little-endian)")
    for code, native in _NATIVE.items():
        if dt == native:
            return code
    raise CheckpointError(f"dtype {dt} has no safetensors equivalent")


def is_floating(code: str) -> bool:
    return code in ("F64", "F32", "F16", "BF16")


def to_float32(arr: np.ndarray) -> np.ndarray:
    """float32 copy of a floating array, including BF16 raw arrays (exact widening)."""
    code = code_of(arr.dtype)
    if code == "BF16":
        bits = np.ascontiguousarray(arr).view(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32)
    if code in ("F8_E4M3", "F8_E5M2"):
        raise CheckpointError(f"converting {code} to float32 is not supported")
    return np.asarray(arr, dtype=np.float32)


def bf16_from_float32(arr: np.ndarray) -> np.ndarray:
    """Round float32 to BF16 (round to nearest even, NaN kept NaN) as a raw BF16 array."""
    f = np.ascontiguousarray(arr, dtype=np.float32)
    bits = f.view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        rounded[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded.view(BF16)


def cast(arr: np.ndarray, code: str) -> np.ndarray:
    """Convert between floating codes (F64/F32/F16/BF16); any other change is refused."""
    src = code_of(arr.dtype)
    if src == code:
        return arr
    if not (is_floating(src) and is_floating(code)):
        raise CheckpointError(f"cannot convert {src} to {code} (only floating types convert)")
    if code == "BF16":
        return bf16_from_float32(to_float32(arr))
    if src == "BF16":
        return to_float32(arr).astype(numpy_dtype(code), copy=False)
    return arr.astype(numpy_dtype(code))


def assign(out: np.ndarray, data: np.ndarray) -> None:
    """`out[...] = data`, converting floating types and bridging equivalent BF16/F8 dtypes."""
    out_code, data_code = code_of(out.dtype), code_of(data.dtype)
    if out_code != data_code:
        data = cast(data, out_code)
    if data.dtype != out.dtype:
        data = data.view(out.dtype)
    out[...] = data
