"""Layer specs: `'5'` is one layer, `'0-3'` the closed range 0, 1, 2, 3.

One parser serves every field that names transformer layers (`recompute.full_recompute_layer`,
`recompute.select_module`, `recompute_comm.select_module`, `swap.layer_swap[].layers`,
`swap.op_swap[].layers`, `lora.exclude_layers`) and the pipeline layer placement
(`parallelism.pipeline_parallel_layers_per_stage`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from mf_config.errors import ConfigError

_SPEC = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?")
# Without a model to check against, an index this large is a typo, and expanding it would
# allocate a list of that many ints.
MAX_LAYER_INDEX = 100_000


def _parse_one(spec: Any, key_path: str) -> tuple[int, int]:
    if isinstance(spec, bool) or not isinstance(spec, str):
        hint = f" (write '{spec}' in quotes)" if isinstance(spec, int) and not isinstance(spec, bool) else ""
        raise ConfigError(key_path, f"a layer spec must be a quoted string such as '5' or '0-3'{hint}", spec)
    match = _SPEC.fullmatch(spec)
    if match is None:
        raise ConfigError(key_path, "a layer spec must be 'N' or 'A-B' with non-negative integers A <= B", spec)
    start = int(match[1])
    end = int(match[2]) if match[2] is not None else start
    if end < start:
        raise ConfigError(key_path, f"range end {end} is below its start {start}", spec)
    if end > MAX_LAYER_INDEX:
        raise ConfigError(key_path, f"layer index {end} is implausibly large (limit {MAX_LAYER_INDEX})", spec)
    return start, end


def _check_in_range(end: int, num_layers: int | None, spec: str, key_path: str) -> None:
    if num_layers is not None and end >= num_layers:
        raise ConfigError(
            key_path,
            f"layer {end} is out of range: model.num_hidden_layers is {num_layers} (valid layers 0-{num_layers - 1})",
            spec,
        )


def parse_layer_spec(specs: Sequence[str], num_layers: int | None, key_path: str) -> list[int]:
    """Expand a list of layer specs into the sorted list of layer indices it names.

    The specs must be strings, sorted strictly ascending and non-overlapping
    (`['0-3', '5']` is fine, `['5', '0-3']` and `['0-3', '3']` are not), and every index must be
    below `num_layers` when that is known (None skips the range check). Errors name
    `key_path[i]` of the offending spec.
    """
    if isinstance(specs, (str, bytes)) or not isinstance(specs, Sequence):
        raise ConfigError(key_path, "must be a list of layer specs such as ['0-3', '5']", specs)
    layers: list[int] = []
    previous_end = -1
    for i, spec in enumerate(specs):
        item_path = f"{key_path}[{i}]"
        start, end = _parse_one(spec, item_path)
        if start <= previous_end:
            raise ConfigError(
                item_path,
                f"layer specs must be sorted strictly ascending and must not overlap (the previous spec ends at layer {previous_end})",
                spec,
            )
        _check_in_range(end, num_layers, spec, item_path)
        layers.extend(range(start, end + 1))
        previous_end = end
    return layers


def check_layers_per_stage_shape(value: Any, key_path: str) -> None:
    """Shape of `pipeline_parallel_layers_per_stage`, checkable without knowing the model.

    Accepted: null or 'auto' (even split), a list of ints (layer counts per virtual stage), or a
    list of strings (per physical stage, comma-separated layer ranges, one per model chunk).
    """
    if value is None or value == "auto":
        return
    if isinstance(value, str):
        raise ConfigError(key_path, "must be 'auto', a list of layer counts per virtual stage, or a list of layer ranges per stage such as ['0-1, 4-8', '2-3, 9']", value)
    if not isinstance(value, list) or not value:
        raise ConfigError(key_path, "must be 'auto', null, or a non-empty list", value)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        for i, count in enumerate(value):
            if count < 1:
                raise ConfigError(f"{key_path}[{i}]", "every virtual stage needs at least one layer", count)
        return
    if all(isinstance(v, str) for v in value):
        for i, stage in enumerate(value):
            for k, spec in enumerate(stage.split(",")):
                _parse_one(spec, f"{key_path}[{i}] (chunk {k})")
        return
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            raise ConfigError(f"{key_path}[{i}]", "must be a layer count (int) or a layer-range string", v)
    raise ConfigError(key_path, "mixes layer counts (ints) and layer ranges (strings); use one form", value)


# Schedules whose model chunks are placed in a V (rank i holds virtual stages i and 2pp-1-i) and
# that always have two chunks per rank.
V_SCHEDULES = ("zbv",)


def pipeline_chunks(schedule: str, interleave_num: int) -> int:
    """Model chunks per pipeline rank: two for the V schedules, else `interleave_num`."""
    return 2 if schedule in V_SCHEDULES else interleave_num


def even_layer_counts(num_layers: int, stages: int) -> list[int]:
    """`num_layers // stages` per virtual stage, the remainder one layer each on the stages just before
    the last, walking towards the first (MindFormers' rule: the last stage also holds the head and
    the loss, so it never takes an extra layer; 10 layers on 4 stages -> [2, 3, 3, 2])."""
    counts = [num_layers // stages] * stages
    for i in range(2, num_layers % stages + 2):
        counts[-i] += 1
    return counts


def pipeline_layer_placement(
    layers_per_stage: Any,
    pipeline_parallel: int,
    interleave_num: int,
    num_layers: int | None,
    key_path: str = "parallelism.pipeline_parallel_layers_per_stage",
    schedule: str = "1f1b",
) -> list[list[int]]:
    """The layer indices of every virtual pipeline stage, in execution order.

    There are `pipeline_parallel * chunks` virtual stages, chunks = `interleave_num` (two for
    `zbv`). Chunk `k` of physical stage `i` is virtual stage `k * pipeline_parallel + i`; for
    `zbv` (a V) chunk 1 of stage `i` is virtual stage `2 * pipeline_parallel - 1 - i`.
    `layers_per_stage` is one of:

    - None or 'auto': `num_layers // stages` layers per virtual stage, the remainder placed as
      MindFormers does (`even_layer_counts`: one extra layer each on the stages before the last);
    - a list of ints: the layer count of each virtual stage, in order (sums to `num_layers`);
    - a list of strings, one per physical stage, each holding `chunks` comma-separated layer
      ranges (`['0-1, 4-8', '2-3, 9']`): taken in virtual-stage order, the ranges must cover
      layers 0 .. num_layers-1 contiguously.

    `num_layers` None skips the checks that need the model (only 'auto' cannot do without it).
    """
    check_layers_per_stage_shape(layers_per_stage, key_path)
    chunks = pipeline_chunks(schedule, interleave_num)
    stages = pipeline_parallel * chunks
    if layers_per_stage is None or layers_per_stage == "auto":
        if num_layers is None:
            raise ConfigError(key_path, "'auto' placement needs model.num_hidden_layers", layers_per_stage)
        if num_layers < stages:
            raise ConfigError(
                key_path,
                f"'auto' needs at least one layer per virtual stage: model.num_hidden_layers={num_layers} is fewer "
                f"than pipeline_parallel x chunks = {stages}; lower pipeline_parallel or the chunk count",
                layers_per_stage,
            )
        return _placement_from_counts(even_layer_counts(num_layers, stages), stages, num_layers, key_path)
    if isinstance(layers_per_stage[0], int):
        return _placement_from_counts(layers_per_stage, stages, num_layers, key_path)
    return _placement_from_ranges(layers_per_stage, pipeline_parallel, chunks, num_layers, key_path,
                                  v_shape=schedule in V_SCHEDULES)


def _placement_from_counts(counts: list[int], stages: int, num_layers: int | None, key_path: str) -> list[list[int]]:
    if len(counts) != stages:
        raise ConfigError(
            key_path,
            f"needs one layer count per virtual stage (pipeline_parallel x model chunks per stage = {stages}), "
            f"got {len(counts)} entries",
            counts,
        )
    if num_layers is not None and sum(counts) != num_layers:
        raise ConfigError(key_path, f"layer counts sum to {sum(counts)} but model.num_hidden_layers is {num_layers}", counts)
    placement, start = [], 0
    for count in counts:
        placement.append(list(range(start, start + count)))
        start += count
    return placement


def _placement_from_ranges(
    stage_specs: list[str], pipeline_parallel: int, interleave_num: int, num_layers: int | None, key_path: str,
    v_shape: bool = False,
) -> list[list[int]]:
    if len(stage_specs) != pipeline_parallel:
        raise ConfigError(
            key_path,
            f"needs one entry per pipeline stage (pipeline_parallel = {pipeline_parallel}), got {len(stage_specs)}",
            stage_specs,
        )
    virtual: dict[int, tuple[int, int, int]] = {}
    for i, stage in enumerate(stage_specs):
        chunks = stage.split(",")
        if len(chunks) != interleave_num:
            raise ConfigError(
                f"{key_path}[{i}]",
                f"needs {interleave_num} comma-separated layer range(s), one per model chunk "
                f"({'zbv has two' if v_shape else 'pipeline_parallel_interleave_num'}), found {len(chunks)}",
                stage,
            )
        for k, chunk in enumerate(chunks):
            start, end = _parse_one(chunk, f"{key_path}[{i}]")
            stage = 2 * pipeline_parallel - 1 - i if v_shape and k == 1 else k * pipeline_parallel + i
            virtual[stage] = (start, end, i)
    placement, expected = [], 0
    for v in range(pipeline_parallel * interleave_num):
        start, end, i = virtual[v]
        if start != expected:
            raise ConfigError(
                f"{key_path}[{i}]",
                f"virtual stage {v} must start at layer {expected}: taken in virtual-stage order the ranges must "
                "cover the layers from 0 upwards without gaps or overlap",
                stage_specs[i],
            )
        placement.append(list(range(start, end + 1)))
        expected = end + 1
    if num_layers is not None and expected != num_layers:
        raise ConfigError(
            key_path,
            f"the ranges cover layers 0-{expected - 1} but model.num_hidden_layers is {num_layers}",
            stage_specs,
        )
    return placement
