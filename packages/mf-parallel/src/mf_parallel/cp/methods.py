"""The YAML's context_parallel* fields, checked, and the attention Cell each method builds.

    settings = ContextParallelSettings.from_config(cfg["parallelism"])       # or the keyword form
    check_context_parallel(dims, settings, local_heads, local_kv_heads)      # one keyed line if not
    core = context_parallel_attention(mesh, settings, scale=..., inner=model_core)

| method   | needs                                      | per layer and step, each rank                     |
|----------|--------------------------------------------|---------------------------------------------------|
| colossal | sequence divisible by 2 x cp               | cp - 1 K/V messages forward, 2(cp - 1) + 1 back;  |
|          |                                            | [S/cp, S/cp]-sized score blocks, nothing gathered |
| ulysses  | heads (per tp rank) divisible by cp        | 4 all-to-alls forward (q, k, v, out), 4 back;     |
|          |                                            | full [S, S] scores for heads / cp heads           |
| hybrid   | ulysses_degree_in_cp u divides cp and the  | Ulysses over u neighbouring ranks, ring over the  |
|          | heads; sequence divisible by 2 x cp        | cp / u groups                                     |

context_parallel_mask_type accepts "causal" only (the seed's one value): causal attention, and
packed documents as block-diagonal causal masks carried by segment ids (`layout.py`).
context_parallel_async orders each ring step's exchange before its computation (see `ring.py`);
Ulysses has no ring, so there it has nothing to act on (the all-to-alls are on the critical path),
nor on a synchronous backend such as CPU's MCCL, where the order changes but nothing overlaps
(mf-trainer's preflight says either in one notice line). `ulysses_degree_in_cp` acts with 'hybrid'
only ('ulysses' spans every cp rank, 'colossal' none).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mf_parallel.errors import ParallelConfigError

METHODS: tuple[str, ...] = ("colossal", "ulysses", "hybrid")
MASK_TYPES: tuple[str, ...] = ("causal",)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class ContextParallelSettings:
    """context_parallel_method, ulysses_degree_in_cp, context_parallel_mask_type and
    context_parallel_async, validated on construction (each error names its YAML key)."""

    method: str = "colossal"
    ulysses_degree: int | None = None
    mask_type: str = "causal"
    async_comm: bool = False

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ParallelConfigError(
                f"parallelism.context_parallel_method: must be one of {', '.join(METHODS)}, got {self.method!r}")
        if self.mask_type not in MASK_TYPES:
            raise ParallelConfigError(
                f"parallelism.context_parallel_mask_type: {self.mask_type!r} is not supported; only 'causal' "
                "(causal attention; packed documents as block-diagonal causal masks) is implemented")
        if not isinstance(self.async_comm, bool):
            raise ParallelConfigError(f"parallelism.context_parallel_async: must be true or false, got {self.async_comm!r}")
        degree = self.ulysses_degree
        if degree is not None and (isinstance(degree, bool) or not isinstance(degree, int) or degree < 1):
            raise ParallelConfigError(f"parallelism.ulysses_degree_in_cp: must be a positive integer or null, got {degree!r}")
        if self.method == "hybrid" and degree is None:
            raise ParallelConfigError("parallelism.ulysses_degree_in_cp: is required with context_parallel_method "
                                      "'hybrid' (the Ulysses degree inside each ring step)")
    @classmethod
    def from_config(cls, parallelism: Mapping[str, Any] | Any | None) -> ContextParallelSettings:
        """From the YAML `parallelism` block (a mapping or an object with those attributes)."""
        def get(key: str, default):
            if parallelism is None:
                return default
            value = parallelism.get(key, default) if isinstance(parallelism, Mapping) else getattr(parallelism, key, default)
            return default if value is None and default is not None else value

        return cls(method=get("context_parallel_method", "colossal"), ulysses_degree=get("ulysses_degree_in_cp", None),
                   mask_type=get("context_parallel_mask_type", "causal"), async_comm=get("context_parallel_async", False))

    def ulysses_degree_for(self, cp: int) -> int:
        """Ranks each all-to-all spans: 1 (colossal), cp (ulysses), ulysses_degree_in_cp (hybrid)."""
        return {"colossal": 1, "ulysses": cp}.get(self.method, self.ulysses_degree or 1)


def context_parallel_problems(dims, settings: ContextParallelSettings, heads: int, kv_heads: int,
                              seq_len: int | None = None) -> list[str]:
    """Every reason `settings` cannot run on `dims` for attention with `heads` / `kv_heads` heads per
    tensor-parallel rank (and `seq_len` tokens, when known): one keyed line each, empty if it can."""
    cp = dims.cp
    problems: list[str] = []
    if cp == 1:
        return problems
    tp_note = f" ({heads * dims.tp} / tensor_parallel {dims.tp})" if dims.tp > 1 else ""
    if settings.method == "ulysses" and heads % cp:
        options = [d for d in _divisors(heads) if d > 1 and dims.world_size % (d * dims.tp) == 0]
        problems.append(
            f"parallelism.context_parallel: {cp} does not divide the {heads} attention heads a tensor-parallel rank "
            f"holds{tp_note}; Ulysses splits heads over the cp ranks: use context_parallel one of {options or [1]} "
            f"or context_parallel_method 'colossal'")
    if settings.method == "hybrid":
        u = settings.ulysses_degree
        if not 1 < u < cp or cp % u:
            valid = [d for d in _divisors(cp) if 1 < d < cp and heads % d == 0]
            problems.append(
                f"parallelism.ulysses_degree_in_cp: {u} must divide context_parallel {cp} and lie strictly between 1 "
                f"and {cp} (1 is 'colossal', {cp} is 'ulysses'); valid here: {valid or 'none'}")
        elif heads % u:
            valid = [d for d in _divisors(math.gcd(cp, heads)) if 1 < d < cp]
            problems.append(
                f"parallelism.ulysses_degree_in_cp: {u} does not divide the {heads} attention heads a tensor-parallel "
                f"rank holds{tp_note}; valid here: {valid or 'none (use colossal)'}")
    if seq_len is not None and seq_len % (2 * cp):
        problems.append(
            f"parallelism.context_parallel: a sequence of {seq_len} tokens does not split into 2 x context_parallel = "
            f"{2 * cp} equal chunks; use a seq_length divisible by {2 * cp}")
    if kv_heads < 1 or heads % kv_heads:
        problems.append(f"model: {kv_heads} key/value heads do not serve {heads} query heads")
    return problems


def check_context_parallel(dims, settings: ContextParallelSettings, heads: int, kv_heads: int,
                           seq_len: int | None = None) -> None:
    """Raise the first of `context_parallel_problems` as a ParallelConfigError."""
    problems = context_parallel_problems(dims, settings, heads, kv_heads, seq_len)
    if problems:
        raise ParallelConfigError(problems[0])


def context_parallel_attention(mesh, settings: ContextParallelSettings, *, scale: float, inner=None):
    """The Cell replacing an attention core on this rank: (q, k, v, segment_ids | None) -> out.

    `inner` is the model's own core (`(q, k, v, bool mask) -> out`), which Ulysses runs on the
    gathered sequence; the ring methods compute attention themselves with `scale`."""
    from mf_parallel.cp.ring import RingAttention
    from mf_parallel.cp.ulysses import HybridAttention, UlyssesAttention

    cp_group = mesh["cp"]
    if settings.method == "colossal":
        return RingAttention(cp_group, scale, settings.async_comm)
    if settings.method == "ulysses":
        if inner is None:
            raise ParallelConfigError("context_parallel_attention: 'ulysses' runs the model's attention core on the "
                                      "gathered sequence; pass it as inner=")
        return UlyssesAttention(cp_group, inner)
    ulysses, ring = mesh.cp_subgroups(settings.ulysses_degree)
    return HybridAttention(ulysses, ring, scale, settings.async_comm)
