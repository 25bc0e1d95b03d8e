"""Which rank holds which layers: pipeline schedules, virtual stages and their placement.

Pure Python (no MindSpore): `mf plan`, the config checks and the executor read the same answers.

A model of L decoder layers is cut into V = pp x chunks *virtual stages*, run in order 0 .. V-1;
virtual stage 0 also holds the embedding, virtual stage V-1 the final norm, the output head and the
loss. Two placements of virtual stages on the pp ranks:

- "loop" (Megatron's interleaving, also plain 1F1B / GPipe with one chunk): chunk c of rank r is
  virtual stage c * pp + r, so activations go round the ranks `chunks` times.
- "v" (ZB-V): two chunks per rank in a V, rank r holds virtual stages r and 2pp-1-r. The first and
  the last virtual stage are on rank 0, and the turn (stages pp-1 -> pp) stays on rank pp-1.

Tied embeddings: with "loop" placement the embedding (stage 0, rank 0) and the head (stage V-1,
rank pp-1) are on different ranks; each keeps a copy of the table and their gradients are summed
between the two ranks after the backward (Megatron's embedding group), so both copies take the same
optimizer step and stay equal. With "v" placement both ends are on rank 0: one Parameter, no sync.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mf_parallel.errors import ParallelConfigError

SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved_1f1b", "zbv")
_KEY = "parallelism.pipeline_parallel"
# The schedule is Python objects per computation (planned, validated and simulated before the
# first step): beyond this it takes minutes and gigabytes, for a step no pipeline runs.
MAX_COMPUTATIONS = 1_000_000


@dataclass(frozen=True)
class PipelineSpec:
    """A resolved pipeline configuration: the schedule and how the model is cut.

    `schedule` is the one that runs: `1f1b` with chunks > 1 is `interleaved_1f1b` (as the YAML
    reference says), `zbv` always has two chunks and a split backward.
    """

    pp: int
    schedule: str
    chunks: int = 1
    split_backward: bool = False
    overlap_p2p: bool = False
    overlap_b_f: bool = False

    @property
    def style(self) -> str:
        return "v" if self.schedule == "zbv" else "loop"

    @property
    def virtual_stages(self) -> int:
        return self.pp * self.chunks

    def describe(self) -> str:
        parts = [f"{self.schedule} over {self.pp} stage{'s' if self.pp > 1 else ''}"]
        if self.chunks > 1:
            parts.append(f"{self.chunks} chunks per rank ({self.style} placement)")
        if self.split_backward:
            parts.append("backward split into dx and dw")
        flags = [name for name, on in (("overlap_p2p", self.overlap_p2p), ("overlap_b_f", self.overlap_b_f)) if on]
        if flags:
            parts.append(" + ".join(flags))
        return ", ".join(parts)

    def check_microbatches(self, microbatches: int) -> None:
        """Raise unless this schedule can run `microbatches` micro-batches per optimizer step."""
        if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
            raise ParallelConfigError(f"pipeline: the micro-batch count must be a positive integer, got {microbatches!r}")
        computations = microbatches * self.pp * self.chunks * (3 if self.split_backward else 2)
        if computations > MAX_COMPUTATIONS:
            raise ParallelConfigError(
                f"training.global_batch_size: {microbatches:,} micro-batches per step through {self.pp * self.chunks} "
                f"virtual pipeline stages is {computations:,} computations per step, more than the "
                f"{MAX_COMPUTATIONS:,} a pipeline schedule is built for (the micro-batch count is global_batch_size / "
                f"(data-parallel size x local_batch_size)): lower global_batch_size or raise local_batch_size")
        if self.schedule == "interleaved_1f1b" and microbatches % self.pp:
            options = [self.pp * k for k in range(1, 5)]
            raise ParallelConfigError(
                f"{_KEY}_schedule: interleaved_1f1b needs a micro-batch count that is a multiple of "
                f"pipeline_parallel = {self.pp}, got {microbatches} (the micro-batch count is training.global_batch_size / "
                f"(data-parallel size x training.local_batch_size)); make it one of {options}, or use "
                f"{_KEY}_interleave_num: 1")


def _get(block: Mapping[str, Any] | Any | None, key: str, default: Any) -> Any:
    if block is None:
        return default
    value = block.get(key, default) if isinstance(block, Mapping) else getattr(block, key, default)
    return default if value is None else value


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ParallelConfigError(f"{_KEY}_{name}: must be true or false, got {value!r}")
    return value


def resolve_pipeline(pp: int, schedule: str = "1f1b", interleave_num: int = 1, *, dxdw_split: bool = False,
                     overlap_p2p: bool = False, overlap_b_f: bool = False) -> PipelineSpec:
    """The schedule that runs for these YAML options, or one ParallelConfigError line naming the fix."""
    for name, value in (("", pp), ("_interleave_num", interleave_num)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ParallelConfigError(f"{_KEY}{name}: must be a positive integer, got {value!r}")
    if schedule not in SCHEDULES:
        raise ParallelConfigError(f"{_KEY}_schedule: must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    dxdw_split = _flag("enable_dxdw_split", dxdw_split)
    overlap_p2p = _flag("overlap_p2p", overlap_p2p)
    overlap_b_f = _flag("overlap_b_f", overlap_b_f)
    if pp == 1:
        for name, on in (("interleave_num", interleave_num > 1), ("enable_dxdw_split", dxdw_split),
                         ("overlap_p2p", overlap_p2p), ("overlap_b_f", overlap_b_f)):
            if on:
                raise ParallelConfigError(f"{_KEY}_{name}: only acts with pipeline_parallel > 1; set it back to its "
                                          f"default or raise pipeline_parallel")
        if schedule == "zbv":
            raise ParallelConfigError(f"{_KEY}_schedule: zbv needs pipeline_parallel > 1")
    if schedule == "gpipe":
        if interleave_num > 1:
            raise ParallelConfigError(f"{_KEY}_interleave_num: must be 1 with pipeline_parallel_schedule 'gpipe' "
                                      f"(interleaving is a 1f1b schedule), got {interleave_num}")
        if dxdw_split:
            raise ParallelConfigError(f"{_KEY}_enable_dxdw_split: gpipe runs every backward after every forward, so "
                                      f"there is no steady state to defer weight gradients into; use "
                                      f"pipeline_parallel_schedule '1f1b' (ZB-H1) or 'zbv'")
    # overlap_b_f is accepted with every schedule: where the schedule has no forward and backward
    # to run together (gpipe, ZB-V, too few micro-batches) it only affects speed and changes
    # nothing, which the executor says in one line (schedules.overlap_b_f_idle_reason).
    if schedule == "zbv":
        if interleave_num not in (1, 2):
            raise ParallelConfigError(f"{_KEY}_interleave_num: zbv places exactly two chunks per rank in a V; set "
                                      f"it to 1 or 2, got {interleave_num}")
        return PipelineSpec(pp, "zbv", 2, True, overlap_p2p, overlap_b_f)
    if schedule == "interleaved_1f1b" and interleave_num == 1:
        raise ParallelConfigError(f"{_KEY}_schedule: interleaved_1f1b needs pipeline_parallel_interleave_num > 1 "
                                  f"(model chunks per rank); set it, or use '1f1b'")
    if schedule == "1f1b" and interleave_num > 1:
        schedule = "interleaved_1f1b"
    return PipelineSpec(pp, schedule, interleave_num, dxdw_split, overlap_p2p, overlap_b_f)


def pipeline_from_config(parallelism: Mapping[str, Any] | Any | None) -> PipelineSpec:
    """`resolve_pipeline` from the YAML `parallelism` block (a mapping or an object with its keys)."""
    return resolve_pipeline(
        _get(parallelism, "pipeline_parallel", 1), _get(parallelism, "pipeline_parallel_schedule", "1f1b"),
        _get(parallelism, "pipeline_parallel_interleave_num", 1),
        dxdw_split=_get(parallelism, "pipeline_parallel_enable_dxdw_split", False),
        overlap_p2p=_get(parallelism, "pipeline_parallel_overlap_p2p", False),
        overlap_b_f=_get(parallelism, "pipeline_parallel_overlap_b_f", False))


# ----------------------------------------------------------------------------- placement
@dataclass(frozen=True)
class Placement:
    """Virtual stage <-> (rank, chunk) for `pp` ranks with `chunks` chunks each, "loop" or "v"."""

    pp: int
    chunks: int
    style: str = "loop"

    def __post_init__(self) -> None:
        if self.style not in ("loop", "v"):
            raise ParallelConfigError(f"pipeline placement: style must be 'loop' or 'v', got {self.style!r}")
        if self.style == "v" and self.chunks != 2:
            raise ParallelConfigError(f"pipeline placement: the V placement has 2 chunks per rank, got {self.chunks}")

    @classmethod
    def of(cls, spec: PipelineSpec) -> Placement:
        return cls(spec.pp, spec.chunks, spec.style)

    @property
    def virtual_stages(self) -> int:
        return self.pp * self.chunks

    def stage(self, rank: int, chunk: int) -> int:
        """The virtual stage that chunk `chunk` of `rank` runs."""
        if self.style == "v" and chunk == 1:
            return 2 * self.pp - 1 - rank
        return chunk * self.pp + rank

    def owner(self, stage: int) -> tuple[int, int]:
        """(rank, chunk) of virtual stage `stage`."""
        if not 0 <= stage < self.virtual_stages:
            raise ParallelConfigError(f"pipeline placement: no virtual stage {stage} (0..{self.virtual_stages - 1})")
        if self.style == "v" and stage >= self.pp:
            return 2 * self.pp - 1 - stage, 1
        return stage % self.pp, stage // self.pp

    def rank_of(self, stage: int) -> int:
        return self.owner(stage)[0]

    @property
    def first_rank(self) -> int:
        """The rank holding the embedding (virtual stage 0)."""
        return self.rank_of(0)

    @property
    def last_rank(self) -> int:
        """The rank holding the head and the loss (the last virtual stage)."""
        return self.rank_of(self.virtual_stages - 1)


# ----------------------------------------------------------------------------- layers
@dataclass(frozen=True)
class ChunkInfo:
    """One model chunk of one rank."""

    chunk: int
    stage: int
    layers: tuple[int, ...]
    first: bool          # embedding here
    last: bool           # final norm, head and loss here


@dataclass(frozen=True)
class StageLayout:
    """The layers of every virtual stage placed on the ranks.

    `layers` lists the decoder-layer indices of each virtual stage in execution order (what
    mf-config's `pipeline_layer_placement` returns); together they must cover 0 .. L-1 in order.
    A middle virtual stage needs at least one layer; the first and last may hold none (only the
    embedding, or only the head).
    """

    placement: Placement
    layers: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        stages = self.placement.virtual_stages
        if len(self.layers) != stages:
            raise ParallelConfigError(
                f"{_KEY}_layers_per_stage: the layout has {stages} virtual stages (pipeline_parallel {self.placement.pp} "
                f"x {self.placement.chunks} chunks) but {len(self.layers)} layer lists were given")
        expected = 0
        for v, ids in enumerate(self.layers):
            if not ids and 0 < v < stages - 1:
                raise ParallelConfigError(f"{_KEY}_layers_per_stage: virtual stage {v} holds no layer; every middle "
                                          f"stage needs at least one")
            if list(ids) != list(range(expected, expected + len(ids))):
                raise ParallelConfigError(f"{_KEY}_layers_per_stage: virtual stage {v} must hold consecutive layers "
                                          f"from {expected}, got {list(ids)}")
            expected += len(ids)

    @classmethod
    def build(cls, spec: PipelineSpec | Placement, layers: Sequence[Sequence[int]]) -> StageLayout:
        placement = spec if isinstance(spec, Placement) else Placement.of(spec)
        return cls(placement, tuple(tuple(int(i) for i in ids) for ids in layers))

    @property
    def num_layers(self) -> int:
        return sum(len(ids) for ids in self.layers)

    def chunks(self, rank: int) -> list[ChunkInfo]:
        """The chunks of `rank`, by chunk index."""
        if not 0 <= rank < self.placement.pp:
            raise ParallelConfigError(f"pipeline layout: no pipeline rank {rank} (0..{self.placement.pp - 1})")
        last = self.placement.virtual_stages - 1
        out = []
        for c in range(self.placement.chunks):
            v = self.placement.stage(rank, c)
            out.append(ChunkInfo(chunk=c, stage=v, layers=self.layers[v], first=v == 0, last=v == last))
        return out

    @property
    def tied_ranks(self) -> tuple[int, ...]:
        """Pipeline ranks holding a copy of a tied embedding table (one rank: no sync needed)."""
        return tuple(sorted({self.placement.first_rank, self.placement.last_rank}))

    def describe(self) -> str:
        """One line per rank, e.g. `rank 0: v0 embedding + layers 0-3, v3 layers 10-11 + head`."""
        rows = []
        for r in range(self.placement.pp):
            parts = []
            for info in self.chunks(r):
                ids = info.layers
                span = ("no layers" if not ids else f"layer {ids[0]}" if len(ids) == 1 else f"layers {ids[0]}-{ids[-1]}")
                text = ("embedding + " if info.first else "") + span + (" + head" if info.last else "")
                parts.append(f"v{info.stage} {text}")
            rows.append(f"rank {r}: " + ", ".join(parts))
        return "\n".join(rows)
