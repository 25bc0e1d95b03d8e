"""Saving a sharded state: every rank writes its own files, rank 0 commits.

One save, in order (all ranks call `Saver.save` together):
1. metadata (`global_layout.agree_layout`): the ranks gather their chunk descriptions, rank 0
   builds the global layout and hands each rank its write list, or every rank raises the same
   error. With a layout cache (`save_global_layout_cache`) later saves skip this: each rank checks
   its own structure against the cached one (no collective); an async save confirms with one
   gather of flags before writing, a synchronous one writes by the cached plan at once and lets
   the commit's gather carry the verdicts. If any rank's structure changed, every rank discards
   what it staged and the save runs again through the full exchange. Nothing is committed before
   all agree.
2. write: each rank writes `{prefix}-model-{rank:07d}-{world:07d}.safetensors` (and `-opt-`) into a
   hidden staging directory; rank 0 adds metadata.json. With `async_save` the chunks are copied to
   host memory first and a background thread writes them.
3. commit (at once, or for async saves at the next save/poll/wait/finalize): the ranks gather
   their write status; if all succeeded rank 0 writes the assets (files the checkpoint carries,
   e.g. `tokenizer/tokenizer.model`, see assets.py), metadata.json (with every chunk's and asset's
   checksum) and common.json, renames the staging directory to `iteration_{N:08d}`, replaces
   `latest_checkpointed_iteration.txt` atomically, and rotates.
   Any failure is raised on every rank. A process killed at any point leaves the previous
   committed checkpoint, and the marker pointing at it, intact.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

from . import assets as carried
from . import checksums as crc
from . import jsonable
from .async_writer import AsyncWriter
from .ckpt_dir import (
    COMMON,
    FORMAT,
    FORMAT_VERSION,
    METADATA,
    check_iteration,
    iteration_name,
    read_marker,
    replaced_name,
    shard_file,
    staging_name,
    trash_name,
    write_marker,
)
from .collectives import Collective, SingleProcess
from .errors import CheckpointError
from .fsutil import atomic_write_bytes, fsync_dir, write_json
from .global_layout import LayoutCache, RankPlan, agree_layout, as_sharded, signature
from .options import SaveOptions
from .rotation import remove_leftovers, rotate
from .st_io import Entry, write_file


@dataclass
class SaveResult:
    iteration: int
    path: Path  # the committed iteration directory (the staging directory until committed)
    committed: bool
    layout_cache_hit: bool
    bytes_written: int = 0  # by this rank
    # seconds: metadata (wall, including waiting for the other ranks), metadata_cpu (this rank's
    # own CPU time in that phase), snapshot, write, commit
    timings: dict[str, float] = field(default_factory=dict)
    deleted: list[int] = field(default_factory=list)  # iterations removed by save_max rotation


@dataclass
class _Pending:
    iteration: int
    staging: Path
    common: Any
    per_rank: Any
    result: SaveResult
    future: Future | None = None
    error: str | None = None
    # A save written by the cached plan without asking: (iteration, structure unchanged), checked
    # by every rank at commit.
    unconfirmed: tuple[int, bool] | None = None
    metadata: bytes | None = None   # rank 0: metadata.json without its checksums (added at commit)
    checksums: dict[str, dict[str, int]] = field(default_factory=dict)  # this rank's {file: {key: crc}}
    assets: dict[str, bytes] = field(default_factory=dict)  # rank 0: files to carry, read at save()


class _StaleLayout(Exception):
    """Some rank's structure no longer matches the cached layout: the save must be redone."""


def _versions() -> dict[str, str]:
    out = {}
    for dist in ("mf-ckpt", "numpy", "safetensors"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "unknown"
    return out


def common_info(iteration: int, world_size: int, common_json: Any, per_rank: list[Any] | None = None) -> dict:
    """The content of common.json (`common_json` already encoded by `jsonable.encode`)."""
    info = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "iteration": iteration,
        "world_size": world_size,
        "saved_at": time.time(),
        "versions": _versions(),
        "common": common_json,
    }
    if per_rank and any(p is not None for p in per_rank):
        info["per_rank"] = per_rank
    return info


def with_checksums(metadata: bytes, written: dict[str, dict[str, int]],
                   assets: dict[str, carried.Record] | None = None) -> bytes:
    """metadata.json's bytes with the "checksums" entry (one per chunk) from what the ranks wrote
    ({file: {key: crc}}), and the "assets" entry when the checkpoint carries files. The layout part
    (cached between saves, possibly megabytes) is spliced, not encoded again: it is a compact JSON
    object, so the entries go in before its closing brace."""
    entries = {"checksums": crc.for_layout(json.loads(metadata), written)}
    if assets:
        entries[carried.KEY] = carried.to_json(assets)
    body = metadata.rstrip()
    if not body.endswith(b"}") or body == b"{}":
        raise AssertionError("metadata is not a non-empty JSON object")
    blob = b"".join(b',"' + key.encode() + b'":' + json.dumps(value, separators=(",", ":"), sort_keys=True).encode("utf-8")
                    for key, value in entries.items())
    return body[:-1] + blob + b"}\n"


def _describe_error(e: BaseException) -> str:
    if isinstance(e, CheckpointError):
        return str(e)
    if isinstance(e, OSError):
        return f"{e.filename or ''}: {e.strerror or e}".lstrip(": ")
    return f"{type(e).__name__}: {e}"


class Saver:
    """Saves sharded states to `options.save_path`; keeps the layout cache and the async writer.

    All ranks construct it with their collective and call `save`, `poll`, `wait` and `finalize`
    together. Use as a context manager, or call `finalize()` at the end of training so the last
    async save is committed.
    """

    def __init__(self, options: SaveOptions, comm: Collective | None = None):
        if not isinstance(options, SaveOptions):
            raise TypeError("Saver needs a SaveOptions")
        if options.enable_save and not options.save_path:
            raise CheckpointError("SaveOptions.save_path: must be set when enable_save is true")
        self.options = options
        self.comm = comm if comm is not None else SingleProcess()
        self.root = Path(options.save_path)
        self._cache: LayoutCache | None = None
        self._pending: _Pending | None = None
        self._writer = AsyncWriter() if options.async_save else None

    # ---------------------------------------------------------------------------------- save

    def save(
        self,
        iteration: int,
        model_state: Mapping[str, Any],
        optimizer_state: Mapping[str, Any] | None = None,
        *,
        common: Mapping[str, Any] | None = None,
        per_rank: Any = None,
        assets: Mapping[str, Any] | None = None,
    ) -> SaveResult | None:
        """Save one iteration. Returns None when `enable_save` is false.

        `model_state` / `optimizer_state` map names to ShardedTensor (or plain arrays, taken as
        replicated). `common` (step, consumed_samples, RNG states, `hf_config`, ...) is written by
        rank 0 to common.json; `per_rank` is gathered from every rank and stored beside it.
        `assets` are files the checkpoint carries, {"dir/file": bytes or a path read now}, e.g.
        `mf_ckpt.tokenizer_assets(...)`: written by rank 0 into the iteration directory and
        checksummed in metadata.json (other ranks may pass them too; only rank 0 reads them).
        Synchronous saves return once committed; async saves return after the snapshot.
        """
        if not self.options.enable_save:
            return None
        if self._pending is not None:
            self.wait()
        opts = self.options
        t0, cpu0 = time.perf_counter(), time.thread_time()
        error = states = common_json = per_rank_json = None
        prepared: dict[str, bytes] = {}
        try:
            iteration = check_iteration(iteration)
            states = {"model": as_sharded(model_state, "model")}
            if optimizer_state is not None and not opts.no_save_optim:
                states["optimizer"] = as_sharded(optimizer_state, "optimizer")
            common_json = jsonable.encode(dict(common or {}), "common")
            per_rank_json = jsonable.encode(per_rank, "per_rank")
            if self.comm.rank == 0:
                prepared = carried.prepare(assets)
        except CheckpointError as e:
            error = str(e)
        cache = self._cache if opts.save_global_layout_cache else None
        if cache is not None and self._writer is None:
            try:
                return self._save_by_cache(cache, iteration, states, error, common_json, per_rank_json, t0, cpu0,
                                           prepared)
            except _StaleLayout:
                self._cache = cache = None        # every rank got here: redo through the full exchange
                t0, cpu0 = time.perf_counter(), time.thread_time()
        plan, new_cache, hit, token = agree_layout(self.comm, states, iteration, error, cache, opts.prefix,
                                                   opts.remove_redundancy)
        self._cache = new_cache if opts.save_global_layout_cache else None
        t1, cpu1 = time.perf_counter(), time.thread_time()

        staging = self.root / staging_name(iteration, token)
        entries = self._entries(plan, states, copy=opts.async_save)
        t2 = time.perf_counter()
        result = SaveResult(iteration, staging, False, hit,
                            timings={"metadata": t1 - t0, "metadata_cpu": cpu1 - cpu0, "snapshot": t2 - t1})
        pending = _Pending(iteration, staging, common_json, per_rank_json, result, metadata=plan.metadata_bytes,
                           assets=prepared)
        self._pending = pending
        if self._writer is not None:
            pending.future = self._writer.submit(lambda: self._write(plan, entries, staging, result, pending))
            return result
        try:
            self._write(plan, entries, staging, result, pending)
        except Exception as e:  # reported on every rank by the commit step
            pending.error = _describe_error(e)
        return self._commit(block=True)

    def _save_by_cache(self, cache: LayoutCache, iteration: int, states, error: str | None, common_json,
                       per_rank_json, t0: float, cpu0: float, prepared: dict[str, bytes]) -> SaveResult:
        """A synchronous save by the cached plan, with no collective before writing (raises
        _StaleLayout on every rank when some rank's structure changed)."""
        unchanged = error is None and signature(states) == cache.signature
        staging = self.root / staging_name(iteration, cache.next_token())
        t1, cpu1 = time.perf_counter(), time.thread_time()
        result = SaveResult(iteration, staging, False, True,
                            timings={"metadata": t1 - t0, "metadata_cpu": cpu1 - cpu0, "snapshot": 0.0})
        pending = _Pending(iteration, staging, common_json, per_rank_json, result, error=error,
                           unconfirmed=(iteration, unchanged), metadata=cache.plan.metadata_bytes, assets=prepared)
        self._pending = pending
        if unchanged:
            try:
                self._write(cache.plan, self._entries(cache.plan, states, copy=False), staging, result, pending)
            except Exception as e:  # reported on every rank by the commit step
                pending.error = _describe_error(e)
        return self._commit(block=True)

    def _write(self, plan: RankPlan, entries: dict[str, list[Entry]], staging: Path, result: SaveResult,
               pending: _Pending) -> int:
        """This rank's files into the staging directory, checksummed as they are written (rank 0
        writes metadata.json at commit, once every rank's checksums are known)."""
        opts, rank, world = self.options, self.comm.rank, self.comm.world_size
        start = time.perf_counter()
        staging.mkdir(parents=True, exist_ok=True)
        written = 0
        for part, part_entries in entries.items():
            if part_entries:
                name = shard_file(opts.prefix, part, rank, world)
                sums = pending.checksums.setdefault(name, {})
                written += write_file(staging / name, part_entries, {"format": FORMAT}, fsync=opts.fsync,
                                      checksums=sums)
        result.bytes_written = written
        result.timings["write"] = time.perf_counter() - start
        return written

    @staticmethod
    def _entries(plan: RankPlan, states, copy: bool) -> dict[str, list[Entry]]:
        out = {}
        for part, names in plan.writes.items():
            entries = []
            for name in names:
                chunk = states[part][name].chunk
                # async: a host snapshot, so training may update its buffers while we write
                arr = np.array(chunk, copy=True, order="C") if copy else chunk
                entries.append(Entry.of(name, arr))
            out[part] = entries
        return out

    # -------------------------------------------------------------------------------- commit

    def poll(self) -> bool:
        """Commit the pending async save if every rank finished writing. Collective; never blocks
        on I/O. True when nothing is pending any more."""
        if self._pending is None:
            return True
        return self._commit(block=False) is not None

    def wait(self) -> SaveResult | None:
        """Block until the pending save is written and committed (raises if it failed anywhere)."""
        if self._pending is None:
            return None
        return self._commit(block=True)

    def finalize(self) -> SaveResult | None:
        """Commit what is pending and stop the background writer. Call once at the end."""
        try:
            return self.wait()
        finally:
            if self._writer is not None:
                self._writer.shutdown()

    def __enter__(self) -> Saver:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finalize()
        elif self._writer is not None:
            # Another error is propagating (maybe on one rank only): no collectives now, but do
            # not leave a half-written file behind a still-running thread.
            self._writer.shutdown()

    def _commit(self, block: bool) -> SaveResult | None:
        pending = self._pending
        assert pending is not None
        done = True
        if pending.future is not None:
            if block:
                try:
                    pending.future.result()
                except Exception as e:
                    pending.error = _describe_error(e)
            elif pending.future.done():
                exc = pending.future.exception()
                if exc is not None:
                    pending.error = _describe_error(exc)
            else:
                done = False
        t0 = time.perf_counter()
        sums = pending.checksums if done and not pending.error else {}
        status = self.comm.all_gather_object((done, pending.error, pending.per_rank, pending.unconfirmed, sums))
        if not all(s[0] for s in status):
            return None
        self._pending = None
        failures = [(r, s[1]) for r, s in enumerate(status) if s[1]]
        rank = self.comm.rank
        # Every rank shares one staging directory, removed by rank 0 - except that ranks writing by
        # the cached plan may disagree on the iteration, and so on the name: each removes its own.
        owner = rank == 0 or pending.unconfirmed is not None
        if failures:
            if owner:
                shutil.rmtree(pending.staging, ignore_errors=True)
            r, msg = failures[0]
            raise CheckpointError(f"saving iteration {pending.iteration} to {self.root} failed on rank {r}: {msg}")
        if pending.unconfirmed is not None:     # written by the cached plan: did every rank keep it?
            iterations = [s[3][0] for s in status]
            if len(set(iterations)) != 1 or not all(s[3][1] for s in status):
                if owner:
                    shutil.rmtree(pending.staging, ignore_errors=True)
                self.comm.barrier()             # the staging directory is gone before anyone redoes
                if len(set(iterations)) != 1:
                    raise CheckpointError(f"ranks disagree on the iteration to save: {iterations}")
                raise _StaleLayout()
        outcome = None
        if rank == 0:
            try:
                checksums = {file: keys for s in status for file, keys in s[4].items()}
                pending.result.deleted = self._publish(pending, [s[2] for s in status], checksums)
            except Exception as e:
                outcome = _describe_error(e)
        outcome = self.comm.all_gather_object(outcome)[0]
        if outcome:
            raise CheckpointError(f"committing iteration {pending.iteration} to {self.root} failed: {outcome}")
        result = pending.result
        result.committed = True
        result.path = self.root / iteration_name(pending.iteration)
        result.timings["commit"] = time.perf_counter() - t0
        return result

    def _publish(self, pending: _Pending, per_rank: list[Any], checksums: dict[str, dict[str, int]]) -> list[int]:
        """Rank 0: the assets, metadata.json (with every rank's checksums), common.json, rename into
        place, move the marker, rotate."""
        opts, root, it = self.options, self.root, pending.iteration
        records = carried.write(pending.staging, pending.assets, fsync=opts.fsync)
        atomic_write_bytes(pending.staging / METADATA, with_checksums(pending.metadata, checksums, records),
                           fsync=opts.fsync)
        write_json(pending.staging / COMMON, common_info(it, self.comm.world_size, pending.common, per_rank),
                   fsync=opts.fsync)
        if opts.fsync:
            fsync_dir(pending.staging)
        final = root / iteration_name(it)
        if final.exists():
            if read_marker(root) == it:
                # Re-saving the committed iteration: keep the old copy reachable until the new one
                # is in place (the loader falls back to `.replaced` if it finds no iteration dir).
                shutil.rmtree(root / replaced_name(it), ignore_errors=True)
                os.replace(final, root / replaced_name(it))
            else:
                trash = root / trash_name(final.name, secrets.token_hex(4))
                os.replace(final, trash)
        os.replace(pending.staging, final)
        if opts.fsync:
            fsync_dir(root)
        write_marker(root, it, fsync=opts.fsync)
        remove_leftovers(root)
        return rotate(root, opts.save_max, keep=it)


def save(
    options: SaveOptions | str | os.PathLike,
    iteration: int,
    model_state: Mapping[str, Any],
    optimizer_state: Mapping[str, Any] | None = None,
    *,
    common: Mapping[str, Any] | None = None,
    per_rank: Any = None,
    comm: Collective | None = None,
    assets: Mapping[str, Any] | None = None,
) -> SaveResult | None:
    """One-shot save (committed when it returns). For repeated saves keep a `Saver`, which holds
    the layout cache and the async writer."""
    if not isinstance(options, SaveOptions):
        options = SaveOptions(save_path=os.fspath(options))
    saver = Saver(options, comm)
    try:
        result = saver.save(iteration, model_state, optimizer_state, common=common, per_rank=per_rank, assets=assets)
        final = saver.finalize()
        return final or result
    finally:
        if saver._writer is not None:
            saver._writer.shutdown()
