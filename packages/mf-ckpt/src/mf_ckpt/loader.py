"""Loading into sharded destination buffers, resharding on the fly.

Each rank passes the buffers it wants filled (ShardedTensor: local array + global offset), for
any world size and split layout. For each destination box we intersect the stored chunks and read
only those byte ranges. Everything is validated on every rank first (source, shapes, dtypes,
files); the ranks then agree, so either all of them load or all raise the same one-line error,
and no destination buffer has been touched.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import dtypes
from .balanced import load_balanced
from .collectives import Collective, SingleProcess
from .errors import CheckpointError, first_few
from .extract import read_region
from .global_layout import as_sharded
from .layout import CheckpointLayout
from .options import LoadOptions
from .sharding import ShardedTensor, box_slices, intersect
from .sources import open_source, validate_files
from .st_io import ReaderPool


@dataclass(frozen=True)
class Request:
    """Fill box (offset, shape) of destination `name` from chunk `chunk_index` of the checkpoint."""

    part: str
    name: str
    chunk_index: int
    offset: tuple[int, ...]
    shape: tuple[int, ...]
    nbytes: int  # stored bytes


@dataclass
class LoadResult:
    iteration: int | None
    kind: str  # "mf", "hf" or "safetensors"
    common: dict[str, Any]
    per_rank: Any  # what this rank passed as `per_rank` when saving (same world size only)
    optimizer_loaded: bool
    missing: list[str] = field(default_factory=list)  # requested but absent (strict=False only)
    unused: list[str] = field(default_factory=list)  # in the checkpoint, requested by nobody here
    bytes_read: int = 0
    regions_read: int = 0
    seconds: float = 0.0
    checksums_verified: int = 0  # chunks this rank read that were checked against their checksum
    source: str = ""             # the directory loaded: the iteration directory of an mf checkpoint


def plan_requests(layout: CheckpointLayout, dests: dict[str, dict[str, ShardedTensor]], strict: bool):
    """Match destinations with stored chunks; raises CheckpointError for any mismatch."""
    requests: list[Request] = []
    missing: list[str] = []
    for part, state in dests.items():
        metas = layout.parts.get(part)
        if metas is None:
            raise CheckpointError(
                f"{layout.root}: checkpoint has no optimizer state (saved with no_save_optim?); "
                "set no_load_optim to load the model only"
            )
        absent = [n for n in state if n not in metas]
        if absent and strict:
            raise CheckpointError(f"{layout.root}: {part} tensor {first_few(absent)} not in the checkpoint")
        missing += [f"{part}:{n}" if part != "model" else n for n in absent]
        for name, st in state.items():
            meta = metas.get(name)
            if meta is None:
                continue
            where = f"{layout.root}: {part} tensor {name!r}"
            if st.global_shape != meta.shape:
                raise CheckpointError(f"{where} has shape {list(meta.shape)}, destination global shape {list(st.global_shape)}")
            try:
                dest_code = dtypes.code_of(st.data.dtype)
            except CheckpointError as e:
                raise CheckpointError(f"{where}: destination {e}") from None
            if dest_code != meta.dtype and not (dtypes.is_floating(dest_code) and dtypes.is_floating(meta.dtype)):
                raise CheckpointError(f"{where} is {meta.dtype}, destination is {dest_code}")
            if not st.data.flags.writeable:
                raise CheckpointError(f"{where}: destination array is read-only")
            box = st.box
            itemsize = dtypes.itemsize(meta.dtype)
            for i, chunk in enumerate(meta.chunks):
                inter = intersect(box, (chunk.offset, chunk.shape))
                if inter is not None:
                    requests.append(Request(part, name, i, inter[0], inter[1], math.prod(inter[1]) * itemsize))
    return requests, missing


def read_request(pool: ReaderPool, layout: CheckpointLayout, req: Request, dest: ShardedTensor,
                 verify: bool = True) -> None:
    chunk = layout.parts[req.part][req.name].chunks[req.chunk_index]
    view = dest.data[box_slices((req.offset, req.shape), dest.global_offset)]
    if chunk.squeeze:
        view = np.squeeze(view, axis=chunk.squeeze)
    if dtypes.code_of(view.dtype) == layout.parts[req.part][req.name].dtype:
        # straight into the buffer when contiguous (and checked there)
        read_region(pool, layout, req.part, req.name, chunk, req.offset, req.shape, verify, out=view)
    else:
        dtypes.assign(view, read_region(pool, layout, req.part, req.name, chunk, req.offset, req.shape, verify))


def run_requests(pool, layout, requests, dests, workers: int, verify: bool = True) -> None:
    def one(req: Request) -> None:
        read_request(pool, layout, req, dests[req.part][req.name], verify)

    # File order keeps each thread's reads sequential on disk.
    ordered = sorted(requests, key=lambda r: (layout.parts[r.part][r.name].chunks[r.chunk_index].file, r.name))
    if workers <= 1 or len(ordered) <= 1:
        for req in ordered:
            one(req)
        return
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mf-ckpt-reader") as pool_exec:
        list(pool_exec.map(one, ordered))


def load(
    options: LoadOptions | str | os.PathLike,
    model_state: Mapping[str, Any],
    optimizer_state: Mapping[str, Any] | None = None,
    *,
    comm: Collective | None = None,
    iteration: int | None = None,
    strict: bool = True,
) -> LoadResult:
    """Fill `model_state` (and `optimizer_state`) in place from a checkpoint; collective.

    Destinations are ShardedTensor (or plain arrays = the whole tensor). `iteration` picks one
    other than the marker's; `strict=False` tolerates requested tensors the checkpoint lacks
    (listed in `LoadResult.missing`). Floating dtypes convert to the destination's (BF16
    included); any other dtype difference is an error. Every chunk read is checked against the
    checksum metadata.json records for it (`LoadOptions.verify_checksums`, on by default; older
    checkpoints without checksums load unchecked).
    """
    if not isinstance(options, LoadOptions):
        options = LoadOptions(load_path=os.fspath(options))
    if not options.enabled:
        raise CheckpointError("LoadOptions.load_path is empty: nothing to load")
    comm = comm if comm is not None else SingleProcess()
    t0 = time.perf_counter()
    error = None
    layout = requests = missing = dests = headers = None
    try:
        layout = open_source(options.load_path, iteration)
        dests = {"model": as_sharded(model_state, "model")}
        if optimizer_state is not None and not options.no_load_optim:
            dests["optimizer"] = as_sharded(optimizer_state, "optimizer")
        requests, missing = plan_requests(layout, dests, strict)
        headers = validate_files(layout, {(r.part, r.name, r.chunk_index) for r in requests})
    except CheckpointError as e:
        error = str(e)
    summary = [(r.part, r.name, r.chunk_index, r.offset, r.shape, r.nbytes) for r in requests or []]
    gathered = comm.all_gather_object((error, summary if options.load_balanced else None))
    failures = [(r, g[0]) for r, g in enumerate(gathered) if g[0]]
    if failures:
        r, msg = failures[0]
        raise CheckpointError(msg if comm.world_size == 1 else f"rank {r}: {msg}")

    verify = options.verify_checksums
    read_error = None
    with ReaderPool(headers) as pool:
        if options.load_balanced and comm.world_size > 1:
            all_requests = [[Request(*s) for s in g[1]] for g in gathered]
            bytes_read, regions, read_error = load_balanced(comm, pool, layout, all_requests, dests,
                                                            options.load_worker_number, verify)
        else:
            try:
                run_requests(pool, layout, requests, dests, options.load_worker_number, verify)
            except CheckpointError as e:
                read_error = str(e)
            bytes_read, regions = sum(r.nbytes for r in requests), len(requests)
    # A chunk's checksum can only be checked once its bytes are read: the ranks agree again, so
    # a damaged chunk fails every rank (the destinations then hold partial data: do not use them).
    if comm.world_size > 1:
        failures = [(r, e) for r, e in enumerate(comm.all_gather_object(read_error)) if e]
        if failures:
            raise CheckpointError(f"rank {failures[0][0]}: {failures[0][1]}")
    elif read_error:
        raise CheckpointError(read_error)
    checked = sum(1 for r in requests if layout.parts[r.part][r.name].chunks[r.chunk_index].checksum is not None) \
        if verify else 0

    requested = set(dests["model"])
    per_rank = None
    if layout.per_rank is not None and len(layout.per_rank) == comm.world_size:
        per_rank = layout.per_rank[comm.rank]
    return LoadResult(
        iteration=layout.iteration,
        kind=layout.kind,
        common=layout.common,
        per_rank=per_rank,
        optimizer_loaded="optimizer" in dests,
        missing=missing,
        unused=sorted(n for n in layout.parts["model"] if n not in requested),
        bytes_read=bytes_read,
        regions_read=regions,
        seconds=time.perf_counter() - t0,
        checksums_verified=checked,
        source=str(layout.root),
    )
