"""A one-rank mf checkpoint directory written from tensors read one at a time (what merge, the
conversions from HF and PEFT, and merge-lora write)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import assets as carried
from . import jsonable
from .ckpt_dir import COMMON, METADATA, iteration_name, shard_file, write_marker
from .extract import read_box
from .global_layout import LocalEntry, build
from .layout import CheckpointLayout
from .progress import Progress
from .saver import common_info, with_checksums
from .st_io import Entry, ReaderPool, write_file


def model_entries(layout: CheckpointLayout, pool: ReaderPool, part: str) -> list[Entry]:
    """`layout`'s tensors of `part` ("model", "opt") as entries read on demand through `pool`."""
    return [
        Entry(name, meta.dtype, meta.shape, lambda name=name: read_box(layout, pool, part, name))
        for name, meta in layout.parts[part].items()
    ]


def write_single_rank_checkpoint(out: Path, layout: CheckpointLayout | None, pool: ReaderPool | None, iteration: int,
                                 common: dict[str, Any], bar: Progress, prefix: str = "checkpoint",
                                 entries: list[Entry] | None = None, assets: dict[str, bytes] | None = None) -> None:
    """An mf save directory (marker + one iteration, world size 1) holding `layout`'s model, or
    `entries` (same names, dtypes and shapes, e.g. computed from it; required without a layout)
    instead of its stored values, and `assets` (prepared: {"dir/file": bytes})."""
    if entries is None:
        entries = model_entries(layout, pool, "model")
    desc = {"model": [LocalEntry(e.name, e.dtype, e.shape, (0,) * len(e.shape), e.shape, 0) for e in entries]}
    global_layout = build([desc], prefix, remove_redundancy=False)
    it_dir = out / iteration_name(iteration)
    it_dir.mkdir()
    file = shard_file(prefix, "model", 0, 1)
    sums: dict[str, int] = {}
    write_file(it_dir / file, entries, {"format": "mf-ckpt"}, on_bytes=bar.update, checksums=sums)
    records = carried.write(it_dir, assets or {})
    (it_dir / METADATA).write_bytes(with_checksums(global_layout.metadata_bytes, {file: sums}, records))
    (it_dir / COMMON).write_text(json.dumps(common_info(iteration, 1, jsonable.encode(common)), indent=2,
                                            sort_keys=True) + "\n")
    write_marker(out, iteration, fsync=False)  # the whole directory is renamed into place afterwards
