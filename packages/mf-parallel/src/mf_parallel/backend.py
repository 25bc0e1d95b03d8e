"""What each communication backend can do natively, and starting the distributed world.

The table is the single place that decides "native or emulated". Entries say on which groups the
MindSpore primitive (`ops.AllGather`, ...) works: ANY group, only the WORLD group, or NONE. The MCCL
row was measured on MindSpore 2.10.0 CPU ranks started by msrun (see the README's capability table
and `tests-integration/dist/_collectives_worker.py`, which checks every entry that says a primitive
does NOT work still fails, so a MindSpore upgrade that adds kernels is noticed). HCCL and NCCL rows
are the documented abilities of those libraries; they were not measured here. Reduction dtypes:
MCCL all-reduces float32 and float16 only (see `transport.py` for how other dtypes travel).
"""

from __future__ import annotations

import os
from enum import Enum

from mf_parallel.errors import ParallelConfigError


class Support(Enum):
    ANY = "any group"
    WORLD = "world group only"
    NONE = "unsupported"


# Logical collective kinds every strategy uses.
KINDS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")

CAPABILITIES: dict[str, dict[str, Support]] = {
    # MindSpore 2.10.0, CPU, measured (README "Capability table").
    "mccl": {
        "all_reduce": Support.ANY,
        "all_gather": Support.WORLD,
        "reduce_scatter": Support.NONE,
        "all_to_all": Support.NONE,
        "broadcast": Support.WORLD,
        "send_recv": Support.NONE,
    },
    # Ascend and GPU: every primitive on every group (library documentation, not measured here).
    "hccl": {kind: Support.ANY for kind in KINDS},
    "nccl": {kind: Support.ANY for kind in KINDS},
}

REDUCE_OPS: tuple[str, ...] = ("sum", "max", "min", "prod")

# Reduction ops each backend's AllReduce accepts. MCCL measured: "AllReduce only support reduce sum
# on CPU" for max, min and prod (on the world group and on sub-groups alike).
NATIVE_REDUCE_OPS: dict[str, tuple[str, ...]] = {"mccl": ("sum",), "hccl": REDUCE_OPS, "nccl": REDUCE_OPS}

_DEVICE_BACKEND = {"CPU": "mccl", "Ascend": "hccl", "GPU": "nccl"}

# MF_PARALLEL_EMULATE=all (or a comma list of kinds) forces the emulation even where the backend has
# the primitive: how the emulated paths are exercised on Ascend/GPU, and how tests compare the two.
_ENV_FORCE = "MF_PARALLEL_EMULATE"


def backend_name(device_target: str | None = None) -> str:
    """The communication backend of `device_target` (default: MindSpore's current device)."""
    if device_target is None:
        import mindspore as ms

        device_target = ms.get_context("device_target")
    try:
        return _DEVICE_BACKEND[device_target]
    except KeyError:
        raise ParallelConfigError(
            f"context.device_target: no communication backend for {device_target!r}; "
            f"use one of {', '.join(_DEVICE_BACKEND)}") from None


def forced_emulation() -> frozenset[str]:
    """Kinds the environment forces to be emulated (MF_PARALLEL_EMULATE=all|kind,kind)."""
    raw = os.environ.get(_ENV_FORCE, "").strip()
    if not raw:
        return frozenset()
    if raw == "all":
        return frozenset(KINDS)
    kinds = {k.strip() for k in raw.split(",") if k.strip()}
    unknown = kinds - set(KINDS)
    if unknown:
        raise ParallelConfigError(f"{_ENV_FORCE}: unknown collective kind(s) {sorted(unknown)}; use 'all' or of {KINDS}")
    return frozenset(kinds)


def is_native(kind: str, backend: str, is_world: bool) -> bool:
    """Whether the backend's primitive for `kind` works on this group."""
    if kind in forced_emulation():
        return False
    support = CAPABILITIES[backend][kind]
    return support is Support.ANY or (support is Support.WORLD and is_world)


def native_reduce_op(op: str, backend: str) -> bool:
    """Whether AllReduce with reduction `op` is native on `backend` (else: emulated)."""
    if "all_reduce" in forced_emulation():
        return False
    return op in NATIVE_REDUCE_OPS[backend]


def capability_table() -> str:
    """The table as Markdown (the README's copy is generated from this)."""
    lines = ["| collective | " + " | ".join(CAPABILITIES) + " |", "|---" * (len(CAPABILITIES) + 1) + "|"]
    for kind in KINDS:
        lines.append(f"| {kind} | " + " | ".join(CAPABILITIES[b][kind].value for b in CAPABILITIES) + " |")
    lines.append("| all_reduce ops | " + " | ".join(", ".join(NATIVE_REDUCE_OPS[b]) for b in CAPABILITIES) + " |")
    return "\n".join(lines)


def graph_mode_blocker(dims, backend: str | None = None) -> str | None:
    """Why a compiled (GRAPH_MODE) training step is unsafe for the layout `dims`, or None.

    Collectives are blocking: every rank must issue them in the same order. PyNative runs them in
    program order. A compiled step orders independent operations itself; on CPU (MCCL, 2.10.0) two
    ranks of an FSDP2 x TP2 step were seen issuing two tp all-reduces in opposite orders (MCCL's ring
    all-reduce then fails: "Memcpy error ... dest size is 32, src size is 512"), even with the
    collectives' rank-specific values passed as data and side-effect ops ordering them. With a single
    parallel axis every collective is on the world group and the ranks' graphs matched (FSDP2, TP2
    and DDP2 compiled steps pass the parity tests). HCCL/NCCL are not covered by this (not measured).
    """
    from mf_parallel.dims import AXES

    backend = backend or backend_name()
    if backend != "mccl":
        return None
    active = [axis for axis in AXES if getattr(dims, axis) > 1]
    if len(active) <= 1:
        return None
    return (f"GRAPH_MODE on device_target CPU supports one parallel axis per layout; {dims.describe()} uses "
            f"{' x '.join(active)}, whose collectives a compiled step may issue in different orders on different "
            f"ranks: run this layout in PyNative mode")


# ----------------------------------------------------------------------------- the world
_STATE: dict[str, int] = {}


def launched_world_size() -> int:
    """World size announced by the launcher's environment (msrun sets MS_WORKER_NUM), else 1."""
    for key in ("MS_WORKER_NUM", "RANK_SIZE"):
        value = os.environ.get(key)
        if value:
            return int(value)
    return 1


def init_distributed() -> tuple[int, int]:
    """Join the world once (idempotent); returns (rank, world_size). A single process needs no init."""
    if "world" in _STATE:
        return _STATE["rank"], _STATE["world"]
    if launched_world_size() > 1:
        from mindspore.communication import get_group_size, get_rank, init

        init()
        _STATE["rank"], _STATE["world"] = get_rank(), get_group_size()
    else:
        _STATE["rank"], _STATE["world"] = 0, 1
    return _STATE["rank"], _STATE["world"]


def world_group_name() -> str:
    """Name of the backend's world group ("mccl_world_group" on CPU)."""
    from mindspore.communication import GlobalComm

    return GlobalComm.WORLD_COMM_GROUP
