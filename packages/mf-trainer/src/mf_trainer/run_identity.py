"""Which run a checkpoint belongs to: the run identity, the part of a resolved config that says
what a run computes.

Rerunning the same YAML resumes the run its output directory holds, and a config that computes
something else must never resume (or rotate away) another run's checkpoints. Two configs are the
same run when their identities are equal. The identity is the resolved config (mf-config's
defaults filled in) restricted to what defines the computation:

    run_mode, model, tokenizer, lora, optimizer, lr_scheduler, train_dataset, training,
    and where the weights started: checkpoint.load_path (absolute) and checkpoint.no_load_optim

minus the keys that may legitimately change when a run is resumed (`RESUMABLE`):

    training.steps                      extending (or shortening) a run
    training.local_batch_size           how the global batch is cut into micro-batches (memory)
    training.max_consecutive_nonfinite, training.max_skipped_fraction, training.hang_timeout_s
                                        failure policies
    train_dataset.num_parallel_workers, prefetch_size, numa_enable, dataloader.python_multiprocessing
                                        how the data is read

and `checkpoint.load_path` when it names the run's own `checkpoint.save_path` (an explicit resume
of a run is that run). Everything else says how, where or with what extras the run computes and
may change between its sessions: output_dir and checkpoint.save_path themselves, the parallel
layout (mf-ckpt reshards on load), context, checkpoint cadence and rotation, monitor, profiler,
recompute, swap, callbacks, eval_dataset and inference.

Plain data in, plain data out; no MindSpore, no files.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from typing import Any

IDENTITY_VERSION = 1
SECTIONS = ("run_mode", "model", "tokenizer", "lora", "optimizer", "lr_scheduler", "train_dataset", "training")
RESUMABLE = ("training.steps", "training.local_batch_size", "training.max_consecutive_nonfinite",
             "training.max_skipped_fraction", "training.hang_timeout_s", "train_dataset.num_parallel_workers", "train_dataset.prefetch_size",
             "train_dataset.numa_enable", "train_dataset.dataloader.python_multiprocessing")


def _same_path(a: str, b: str) -> bool:
    return bool(a) and bool(b) and os.path.realpath(a) == os.path.realpath(b)


def identity(config: Any) -> dict[str, Any]:
    """The identity of a `TrainConfig`, or of `mf_config.config_to_dict`'s plain data of one."""
    if not isinstance(config, dict):
        from mf_config import config_to_dict

        config = config_to_dict(config)
    out = {name: copy.deepcopy(config.get(name)) for name in SECTIONS}
    for dotted in RESUMABLE:
        *parents, leaf = dotted.split(".")
        node = out
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    ckpt = config.get("checkpoint") or {}
    load_path = ckpt.get("load_path") or ""
    own = _same_path(load_path, ckpt.get("save_path") or "")
    out["start"] = {"load_path": "" if own or not load_path else os.path.abspath(load_path),
                    "no_load_optim": bool(ckpt.get("no_load_optim")) if load_path and not own else False}
    return out


def digest(ident: dict[str, Any]) -> str:
    """A short stable fingerprint of an identity (recorded in common.json for people and tools)."""
    text = json.dumps(ident, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


_ABSENT = "<absent>"


def _diff(a: Any, b: Any, prefix: str = ""):
    """(key, a, b) of every leaf where two identities differ (a section that is null on one side
    and set on the other is one leaf)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            yield from _diff(a.get(key, _ABSENT), b.get(key, _ABSENT), f"{prefix}.{key}" if prefix else str(key))
    elif a != b:
        yield prefix, a, b


def differences(mine: dict[str, Any], theirs: dict[str, Any], limit: int = 3) -> list[str]:
    """`key (X here, Y there)` for the first keys whose values differ (`start.*` spoken as the
    checkpoint keys they come from)."""
    lines = [f"{key.replace('start.', 'checkpoint.', 1)} ({_short(a)} here, {_short(b)} there)"
             for key, a, b in _diff(mine, theirs)]
    return lines[:limit] + ([f"and {len(lines) - limit} more"] if len(lines) > limit else [])


def _short(value: Any) -> str:
    if value is _ABSENT:
        return "absent"
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def recorded_identity(common: dict[str, Any]) -> dict[str, Any] | None:
    """The identity of the run that wrote a checkpoint's common.json: from its resolved training
    config (re-resolved with today's defaults, so a field mf-config added since does not make it
    another run), else the identity it recorded; None when it records neither."""
    train_config = common.get("train_config")
    if isinstance(train_config, dict):
        try:
            import mf_config

            return identity(mf_config.load_config(train_config))
        except Exception:  # an old or foreign config mf-config no longer reads: fall back below
            pass
    recorded = common.get("run_identity")
    if isinstance(recorded, dict) and isinstance(recorded.get("identity"), dict):
        return recorded["identity"]
    return None


def record(config: Any) -> dict[str, Any]:
    """What a checkpoint's common.json carries about its run (`run_identity`)."""
    ident = identity(config)
    return {"version": IDENTITY_VERSION, "digest": digest(ident), "identity": ident}
