"""LoRA (Hu et al. 2021): low-rank adapters on chosen Linear sub-cells, as a transform of a built
model (model.py files know nothing of it).

    adapted = apply_lora(model, r"layers\\.\\d+\\.attention\\.w[qv]", rank=8, alpha=16.0, dropout=0.05)

Each matched `Linear` is replaced by a `LoraLinear` that keeps the base parameters under their
names (`layers.0.attention.wq.weight` stays, frozen: `requires_grad=False`) and adds
`layers.0.attention.wq.lora_a` [r, in] (kaiming-uniform, as torch's Linear and peft initialise it,
from a numpy stream per name: seeded and device independent) and `...lora_b` [out, r] (zeros, so
the adapted model starts exactly as the base). The output is

    y = x W^T (+ bias) + (alpha / r) * dropout(x) A^T B^T

Every parameter that is not an adapter is frozen (embeddings and norms too), so
`model.trainable_params()` is the adapters: what an optimizer should get. The dropout is
MindSpore's (`nn.Dropout`), active only while the model is in training mode (`set_train(True)`).
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Iterable, Mapping

import numpy as np
from mindspore import Parameter, Tensor, nn

from .common.layers import Linear, linear
from .errors import ModelConfigError, ModelStateError

ADAPTER_SUFFIXES = (".lora_a", ".lora_b")
_LAYER = re.compile(r"^layers\.(\d+)\.")


class LoraLinear(Linear):
    """A Linear plus a low-rank update; the base `weight`/`bias` are the original Parameters."""

    def __init__(self, base: Linear, rank: int, alpha: float, dropout: float = 0.0):
        nn.Cell.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.bias = base.bias
        self.compute_dtype = base.compute_dtype
        self.cast_weight = base.cast_weight
        self.rank = int(rank)
        self.alpha = float(alpha)
        self.scaling = self.alpha / self.rank
        dtype = base.weight.dtype
        self.lora_a = Parameter(Tensor(np.zeros((self.rank, self.in_features), np.float32), dtype), name="lora_a")
        self.lora_b = Parameter(Tensor(np.zeros((self.out_features, self.rank), np.float32), dtype), name="lora_b")
        self.dropout = nn.Dropout(p=float(dropout)) if dropout > 0 else None

    def adapter_parameters(self) -> tuple[Parameter, Parameter]:
        return self.lora_a, self.lora_b

    def reset_adapter(self, seed: int, name: str) -> None:
        """A ~ kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)) (torch Linear / peft); B = 0."""
        bound = 1.0 / math.sqrt(self.in_features)
        rng = np.random.default_rng([int(seed), zlib.crc32(f"{name}.lora_a".encode())])
        a = rng.uniform(-bound, bound, (self.rank, self.in_features)).astype(np.float32)
        self.lora_a.set_data(Tensor(a, self.lora_a.dtype))
        self.lora_b.set_data(Tensor(np.zeros((self.out_features, self.rank), np.float32), self.lora_b.dtype))

    def construct(self, x):
        weight, bias = self.weight, self.bias
        lora_a, lora_b = self.lora_a, self.lora_b
        if self.cast_weight:
            weight = weight.astype(self.compute_dtype)
            lora_a = lora_a.astype(self.compute_dtype)
            lora_b = lora_b.astype(self.compute_dtype)
            if bias is not None:
                bias = bias.astype(self.compute_dtype)
        x = x.astype(self.compute_dtype)
        h = x if self.dropout is None else self.dropout(x)
        return linear(x, weight, bias) + linear(linear(h, lora_a), lora_b) * self.scaling

    def linear_terms_trained(self) -> tuple[bool, bool]:
        return bool(self.weight.requires_grad), bool(self.lora_b.requires_grad)

    def linear_terms(self, x):
        """The adapted layer (without bias) as two linear terms, `((x, W), (scaling * dropout(x)
        A^T, B))`: a fused output projection + loss takes them (mf_parallel.LinearCrossEntropy);
        their sum is `construct`'s output, the scaling applied to the rank-r activations instead of
        to the [.., out] product."""
        weight, lora_a, lora_b = self.weight, self.lora_a, self.lora_b
        if self.cast_weight:
            weight = weight.astype(self.compute_dtype)
            lora_a = lora_a.astype(self.compute_dtype)
            lora_b = lora_b.astype(self.compute_dtype)
        x = x.astype(self.compute_dtype)
        h = x if self.dropout is None else self.dropout(x)
        return (x, weight), (linear(h, lora_a) * self.scaling, lora_b)


def _layer_of(name: str) -> int | None:
    m = _LAYER.match(name)
    return int(m.group(1)) if m else None


def _ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    indices = sorted(set(indices))
    parts = []
    start = prev = indices[0]
    for i in indices[1:] + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = i
    return ",".join(parts)


def describe_modules(names: Iterable[str]) -> list[str]:
    """Module names with the layer index folded: `layers.{0-3}.attention.wq`, `output`, ..."""
    groups: dict[str, list[int]] = {}
    order: list[str] = []
    for name in names:
        i = _layer_of(name)
        key = _LAYER.sub("layers.{}.", name) if i is not None else name
        if key not in groups:
            groups[key] = []
            order.append(key)
        if i is not None:
            groups[key].append(i)
    return [key.replace("{}", "{" + _ranges(groups[key]) + "}") if groups[key] else key for key in order]


def linear_modules(model: nn.Cell) -> list[str]:
    """Names of the Linear sub-cells LoRA can adapt (not already adapted)."""
    return [name for name, cell in model.cells_and_names()
            if name and isinstance(cell, Linear) and not isinstance(cell, LoraLinear)]


def _check_layers(exclude_layers, num_layers: int | None) -> set[int]:
    excluded = set()
    for i in exclude_layers or ():
        if not isinstance(i, (int, np.integer)) or isinstance(i, bool) or i < 0:
            raise ModelConfigError(f"lora.exclude_layers: layer indices must be integers >= 0, got {i!r}")
        if num_layers is not None and i >= num_layers:
            raise ModelConfigError(f"lora.exclude_layers: layer {i} does not exist (the model has {num_layers} layers)")
        excluded.add(int(i))
    return excluded


def apply_lora(model: nn.Cell, target_modules: str, rank: int = 8, alpha: float = 16.0, dropout: float = 0.0,
               exclude_layers: Iterable[int] | None = None, seed: int = 0) -> list[str]:
    """Put LoRA adapters on the Linear sub-cells whose full name matches `target_modules`
    (`re.fullmatch`, as peft matches a string pattern; e.g. `.*wq|.*wv` or
    `layers\\.\\d+\\.feed_forward\\..*`), except those of the layers in `exclude_layers` (indices,
    e.g. from `mf_config.parse_layer_spec`). Freezes every other parameter and returns the adapted
    module names. A pattern that matches no Linear is a ModelConfigError listing the ones there are.
    """
    if not isinstance(rank, (int, np.integer)) or isinstance(rank, bool) or rank < 1:
        raise ModelConfigError(f"lora.lora_rank: must be a positive integer, got {rank!r}")
    if not alpha > 0:
        raise ModelConfigError(f"lora.lora_alpha: must be positive, got {alpha!r}")
    if not 0.0 <= dropout < 1.0:
        raise ModelConfigError(f"lora.lora_dropout: must be in [0, 1), got {dropout!r}")
    try:
        pattern = re.compile(target_modules)
    except (re.error, TypeError) as exc:
        raise ModelConfigError(f"lora.target_modules: {target_modules!r} is not a regular expression ({exc})") from None
    args = getattr(model, "args", None)
    excluded = _check_layers(exclude_layers, getattr(args, "num_hidden_layers", None))
    if lora_modules(model):
        raise ModelConfigError("lora: the model already has LoRA adapters")
    candidates = linear_modules(model)
    matched = [n for n in candidates if pattern.fullmatch(n)]
    if not matched:
        raise ModelConfigError(
            f"lora.target_modules: {target_modules!r} matches none of the model's Linear modules (full names, "
            f"re.fullmatch): {', '.join(describe_modules(candidates))}")
    chosen = [n for n in matched if _layer_of(n) not in excluded]
    if not chosen:
        raise ModelConfigError(f"lora.exclude_layers: excludes every module target_modules matches "
                               f"({', '.join(describe_modules(matched))})")
    cells = dict(model.cells_and_names())
    for name in chosen:
        parent_name, _, attr = name.rpartition(".")
        parent = cells[parent_name] if parent_name else model
        adapted = LoraLinear(cells[name], rank, alpha, dropout)
        setattr(parent, attr, adapted)
        adapted.reset_adapter(seed, name)
    # Cell assignment renames a sub-cell's Parameters relative to its parent ("wq.weight"); give
    # every Parameter its full name again (optimizers and checkpoints key on it).
    for name, param in model.parameters_and_names():
        param.name = name
        param.requires_grad = name.endswith(ADAPTER_SUFFIXES)
    return chosen


def lora_modules(model: nn.Cell) -> list[str]:
    return [name for name, cell in model.cells_and_names() if isinstance(cell, LoraLinear)]


def adapter_state(model: nn.Cell) -> dict[str, np.ndarray]:
    """The adapter tensors only ({`<module>.lora_a` / `.lora_b`: array}): an adapter checkpoint."""
    return {name: p.asnumpy() for name, p in model.parameters_and_names() if name.endswith(ADAPTER_SUFFIXES)}


def load_adapter_state(model: nn.Cell, state: Mapping[str, np.ndarray]) -> None:
    """Copy adapter tensors into an adapted model; strict on the adapter names and shapes."""
    params = {n: p for n, p in model.parameters_and_names() if n.endswith(ADAPTER_SUFFIXES)}
    missing = sorted(set(params) - set(state))
    unexpected = sorted(set(state) - set(params))
    bad = sorted(n for n in set(params) & set(state) if tuple(np.shape(state[n])) != tuple(params[n].shape))
    if missing or unexpected or bad:
        parts = [f"{what} {names[:3]}" for what, names in
                 (("missing", missing), ("unexpected", unexpected), ("mis-shaped", bad)) if names]
        raise ModelStateError("adapter state does not match the model's adapters: " + "; ".join(parts))
    for name, p in params.items():
        p.set_data(Tensor(np.asarray(state[name], np.float32), p.dtype))
