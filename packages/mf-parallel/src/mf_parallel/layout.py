"""`Layout`: the `parallelism` section resolved once, for a world of N ranks on a device.

    layout = mf_parallel.Layout.resolve(cfg.parallelism, world=8, device="Ascend")
    layout.dims              # ParallelDims: the world split (data_parallel_shard_strategy no_shard -> DDP replicas)
    layout.pipeline          # PipelineSpec: the schedule that runs (pipeline_parallel 1: no pipeline)
    layout.context           # ContextParallelSettings (context_parallel 1: the defaults)
    layout.fsdp              # FsdpOptions: strategy, reshard policy, gradient division, cpu_offload
    layout.dispatcher        # DispatcherOptions: the MoE token dispatcher under expert parallelism
    layout.sequence_parallel # on whenever tensor_parallel > 1
    layout.idle              # the fields with nothing to act on here, each with its one-line reason
    layout.stage_layout(num_layers, mf_config.pipeline_layer_placement)   # the layers of every stage

This module is the only reader of the section's field names: the Trainer, the model plans
(mf-models' `ParallelOptions` carries a Layout), the memory plan, `mf plan`, `mf train --dry-run`
and mf-trainer's preflight all take this object. It imports no MindSpore, and no mf package: the
input is the YAML block as a mapping or as an object with the field names as attributes
(mf-config's `ParallelismConfig`); a missing or null field takes its default (`FIELDS`, the same
defaults mf-config's schema declares: mf-trainer's tests hold the two equal).

A field that only acts with a feature this layout does not use (a pipeline schedule at
pipeline_parallel 1, a context_parallel_* field without context parallelism, the dispatcher's
fields without expert parallelism, FSDP's knobs without data-parallel ranks, cpu_offload where
host memory is all there is, sequence_parallel without tensor parallelism) is listed in `idle`
and the resolved parts hold its default instead, so what runs and what the preflight says come
from one rule. One exception: context_parallel_async on CPU's synchronous collectives keeps the
ring's order of operations (which changes no result) while its notice says nothing overlaps.

Every refusal is one `ParallelConfigError` line, `parallelism.<field>: <reason>`. `Layout.check`
resolves the parts independently and returns every part's problem (the preflight's use);
`Layout.resolve` raises the first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

from mf_parallel.cp.methods import ContextParallelSettings
from mf_parallel.dims import ParallelDims, check_degree, divisors
from mf_parallel.errors import ParallelConfigError
from mf_parallel.pipeline.stages import PipelineSpec, StageLayout, resolve_pipeline

# The section's fields and their defaults, in the schema's order.
FIELDS: Mapping[str, Any] = MappingProxyType({
    "data_parallel_shard": -1,
    "data_parallel_shard_strategy": "optim_grads_params",
    "reshard_after_forward_policy": "default",
    "cpu_offload": False,
    "disable_gradient_division": True,
    "tensor_parallel": 1,
    "context_parallel": 1,
    "context_parallel_method": "colossal",
    "context_parallel_async": False,
    "ulysses_degree_in_cp": None,
    "context_parallel_mask_type": "causal",
    "pipeline_parallel": 1,
    "pipeline_parallel_layers_per_stage": None,
    "pipeline_parallel_schedule": "1f1b",
    "pipeline_parallel_interleave_num": 1,
    "pipeline_parallel_overlap_p2p": False,
    "pipeline_parallel_overlap_b_f": False,
    "pipeline_parallel_enable_dxdw_split": False,
    "sequence_parallel": False,
    "expert_parallel": 1,
    "npu_nums_per_device": 8,
    "moe_token_dispatcher_type": "alltoall",
})

# data_parallel_shard_strategy values that run, and what each holds.
STRATEGIES: Mapping[str, str] = MappingProxyType({
    "optim_grads_params": "parameters, gradients and optimizer states sharded (ZeRO-3)",
    "no_shard": "every data-parallel rank holds everything (DDP)",
})
RESHARD_POLICIES: tuple[str, ...] = ("always", "never", "default")
# moe_token_dispatcher_type values expert parallelism implements (mf_parallel.expert_parallel).
EP_DISPATCHERS: tuple[str, ...] = ("alltoall", "alltoall_deredundancy")

_DEGREES = {"tp": "tensor_parallel", "cp": "context_parallel", "pp": "pipeline_parallel", "ep": "expert_parallel"}
FSDP_FIELDS = ("data_parallel_shard_strategy", "reshard_after_forward_policy", "disable_gradient_division")
CONTEXT_FIELDS = ("context_parallel_method", "context_parallel_async", "ulysses_degree_in_cp",
                  "context_parallel_mask_type")
PIPELINE_FIELDS = ("pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule",
                   "pipeline_parallel_interleave_num", "pipeline_parallel_overlap_p2p",
                   "pipeline_parallel_overlap_b_f", "pipeline_parallel_enable_dxdw_split")
DISPATCHER_FIELDS = ("moe_token_dispatcher_type", "npu_nums_per_device")


def read_fields(fields: Mapping[str, Any] | Any | None) -> dict[str, Any]:
    """Every field's value (a missing or null one: its default), in `FIELDS` order. A mapping
    naming a field the section does not have is refused (a typo would otherwise pass unseen)."""
    if fields is None:
        return dict(FIELDS)
    if isinstance(fields, Mapping):
        unknown = [k for k in fields if k not in FIELDS]
        if unknown:
            raise ParallelConfigError(f"parallelism.{unknown[0]}: not a field of the parallelism section; the fields "
                                      f"are {', '.join(FIELDS)}")
        values = {name: fields.get(name) for name in FIELDS}
    else:
        values = {name: getattr(fields, name, None) for name in FIELDS}
    return {name: FIELDS[name] if value is None else value for name, value in values.items()}


def changed_fields(fields: Mapping[str, Any] | Any | None) -> dict[str, Any]:
    """The fields whose value differs from the default (what a command that takes no layout says
    it ignores)."""
    return {name: value for name, value in read_fields(fields).items() if value != FIELDS[name]}


def reshard_after_forward_for(policy: str, *, pp_enabled: bool = False, last: bool = False) -> bool:
    """Resolve the YAML `reshard_after_forward_policy` for one FSDP unit.

    "always" reshards every unit; "never" keeps every gathered parameter until backward; "default"
    reshards except under pipeline parallelism (each micro-batch would gather again) and except
    the last unit of the forward (backward needs it right away, so freeing it saves nothing).
    """
    if policy not in RESHARD_POLICIES:
        raise ParallelConfigError(
            f"parallelism.reshard_after_forward_policy: must be one of {', '.join(RESHARD_POLICIES)}, got {policy!r}")
    if policy == "always":
        return True
    if policy == "never":
        return False
    return not pp_enabled and not last


def deredundancy_problem(ep: int, npu_nums_per_device: int) -> str | None:
    """Why `ep` ranks cannot form device groups of `npu_nums_per_device` (the seed's rule: ep >=
    npu_nums_per_device, and the groups must tile the ep group), or None."""
    options = divisors(ep)
    if npu_nums_per_device < 1 or ep < npu_nums_per_device:
        return (f"{npu_nums_per_device} ranks per device group, but expert_parallel is {ep} (alltoall_deredundancy "
                f"needs expert_parallel >= npu_nums_per_device); use one of {options}")
    if ep % npu_nums_per_device:
        return (f"{npu_nums_per_device} does not divide expert_parallel {ep} (alltoall_deredundancy groups the ep "
                f"ranks by npu_nums_per_device; expert_parallel must be a multiple of it); use one of {options}")
    return None


@dataclass(frozen=True)
class FsdpOptions:
    """What FSDP / DDP does with the data-parallel ranks (`fully_shard`'s options)."""

    strategy: str = "optim_grads_params"
    reshard_after_forward_policy: str = "default"
    disable_gradient_division: bool = True      # gradients summed over the shards, not averaged
    cpu_offload: bool = False

    def reshard_after_forward(self, *, pp_enabled: bool, last: bool) -> bool:
        """Whether one FSDP unit frees its gathered parameters after its forward."""
        return reshard_after_forward_for(self.reshard_after_forward_policy, pp_enabled=pp_enabled, last=last)


@dataclass(frozen=True)
class DispatcherOptions:
    """The MoE token dispatcher under expert parallelism: `alltoall`, or the two-level
    `alltoall_deredundancy` over device groups of `npu_nums_per_device` ep ranks."""

    type: str = "alltoall"
    npu_nums_per_device: int = 8


@dataclass(frozen=True)
class Idle:
    """A field with nothing to act on in this layout (or on this device): accepted, said once."""

    field: str
    reason: str

    @property
    def key(self) -> str:
        return f"parallelism.{self.field}"

    def line(self) -> str:
        return f"{self.key}: {self.reason}"


class LayoutCheck(NamedTuple):
    """`Layout.check`'s answer: the layout (a refused part None; None as a whole only when the
    fields cannot be read) and every part's problem line, by part: "strategy", "offload", "dims",
    "pipeline", "context", "dispatcher"."""

    layout: Layout | None
    problems: dict[str, str]


@dataclass(frozen=True)
class Layout:
    """The resolved `parallelism` section (see the module docstring).

    `fields` holds every field as declared (for messages that quote it); the parts hold what runs.
    `dims` is None when resolved without a world (a config checked without one); a part is None
    only in a `Layout.check` answer that names its problem.
    """

    fields: Mapping[str, Any]
    world: int | None
    device: str | None
    tp: int
    cp: int
    pp: int
    ep: int
    dims: ParallelDims | None
    fsdp: FsdpOptions | None
    pipeline: PipelineSpec | None
    context: ContextParallelSettings | None
    dispatcher: DispatcherOptions | None
    layers_per_stage: Any
    idle: tuple[Idle, ...]

    # ----------------------------------------------------------------- construction
    @classmethod
    def resolve(cls, fields: Mapping[str, Any] | Any | None, world: int | None = None,
                device: str | None = None) -> Layout:
        """The layout of `fields` for `world` ranks on `device` ("CPU", "Ascend", ...; None: not
        known, so device-dependent knobs stay as declared); raises the first problem as one
        ParallelConfigError line."""
        layout, problems = cls.check(fields, world, device)
        if problems:
            raise ParallelConfigError(next(iter(problems.values())))
        return layout

    @classmethod
    def for_dims(cls, dims: ParallelDims, fields: Mapping[str, Any] | Any | None = None,
                 device: str | None = None) -> Layout:
        """The layout of an existing world split (`dims`, e.g. a mesh's) with `fields`' options;
        a degree field in `fields` must agree with `dims`."""
        values = read_fields(fields)
        given = {} if fields is None else (dict(fields) if isinstance(fields, Mapping) else values)
        for axis, name in _DEGREES.items():
            if name in given and given[name] is not None and given[name] != getattr(dims, axis):
                raise ParallelConfigError(f"parallelism.{name}: {given[name]} disagrees with the world split "
                                          f"({dims.describe()})")
            values[name] = getattr(dims, axis)
        values["data_parallel_shard"] = dims.dp_shard
        return _build(values, dims.world_size, device, dims).raise_first()

    @classmethod
    def check(cls, fields: Mapping[str, Any] | Any | None, world: int | None = None,
              device: str | None = None) -> LayoutCheck:
        """Every part resolved independently: the layout and each refused part's problem line.
        Never raises for bad values."""
        try:
            values = read_fields(fields)
            for axis, name in _DEGREES.items():
                check_degree(axis, values[name])
            check_degree("dp_shard", values["data_parallel_shard"], allow_auto=True)
        except ParallelConfigError as exc:
            return LayoutCheck(None, {"fields": str(exc)})
        return _build(values, world, device).answer()

    # ----------------------------------------------------------------- what consumers ask
    @property
    def sequence_parallel(self) -> bool:
        """Sequence parallelism follows tensor parallelism: on whenever tensor_parallel > 1."""
        return self.tp > 1

    def stage_layout(self, num_layers: int | None, place: Callable[..., Sequence[Sequence[int]]]) -> StageLayout:
        """The layers of every virtual stage: `place(layers_per_stage, pp, chunks, num_layers,
        schedule=...)` (mf-config's `pipeline_layer_placement`, which owns that field's syntax),
        checked against this pipeline (one stage holding every layer without pipeline stages)."""
        spec = self.pipeline
        return StageLayout.build(spec, place(self.layers_per_stage, spec.pp, spec.chunks, num_layers,
                                             schedule=spec.schedule))

    def reshard_after_forward(self, *, last: bool) -> bool:
        """FSDP's reshard-after-forward of one unit (`last`: the forward's last unit)."""
        return self.fsdp.reshard_after_forward(pp_enabled=self.pp > 1, last=last)

    def describe(self) -> str:
        """One line for logs: the world split (or the degrees, without a world)."""
        if self.dims is not None:
            return self.dims.describe()
        return f"tp={self.tp} cp={self.cp} pp={self.pp} ep={self.ep} (world not given)"


# ----------------------------------------------------------------------------- the parts
class _Build:
    """The parts of one layout, each resolved on its own (a refused part: None and its line)."""

    def __init__(self, values: dict[str, Any], world: int | None, device: str | None) -> None:
        self.values = values
        self.world = world
        self.device = device
        self.problems: dict[str, str] = {}
        self.idle: list[Idle] = []
        self.parts: dict[str, Any] = {}

    def part(self, name: str, fn: Callable[[], Any]) -> Any:
        try:
            value = fn()
        except ParallelConfigError as exc:
            self.problems[name] = str(exc).strip().splitlines()[0]
            value = None
        self.parts[name] = value
        return value

    def unused(self, name: str, needs: str) -> None:
        """`name` differs from its default but `needs` is not the case here."""
        value = self.values[name]
        if value != FIELDS[name]:
            self.idle.append(Idle(name, f"{value!r} only acts with {needs}: nothing to act on in this layout"))

    def layout(self) -> Layout:
        v = self.values
        pp, fsdp = v["pipeline_parallel"], self.parts.get("fsdp")
        return Layout(
            fields=MappingProxyType(dict(v)), world=self.world, device=self.device, tp=v["tensor_parallel"],
            cp=v["context_parallel"], pp=pp, ep=v["expert_parallel"], dims=self.parts.get("dims"), fsdp=fsdp,
            pipeline=self.parts.get("pipeline"), context=self.parts.get("context"),
            dispatcher=self.parts.get("dispatcher"),
            layers_per_stage=v["pipeline_parallel_layers_per_stage"] if pp > 1 else None, idle=tuple(self.idle))

    def answer(self) -> LayoutCheck:
        return LayoutCheck(self.layout(), dict(self.problems))

    def raise_first(self) -> Layout:
        if self.problems:
            raise ParallelConfigError(next(iter(self.problems.values())))
        return self.layout()


def _build(values: dict[str, Any], world: int | None, device: str | None, dims: ParallelDims | None = None) -> _Build:
    b = _Build(values, world, device)
    strategy = b.part("strategy", lambda: _strategy(values["data_parallel_shard_strategy"]))
    offload = b.part("offload", lambda: _offload(b))
    if dims is not None:
        b.parts["dims"] = dims
    elif world is not None:
        dims = b.part("dims", lambda: _world_split(values, world))
    b.parts["fsdp"] = None if strategy is None or offload is None else _fsdp(b, dims, offload)
    b.part("pipeline", lambda: _pipeline(b))
    b.part("context", lambda: _context(b))
    b.part("dispatcher", lambda: _dispatcher(b))
    if values["sequence_parallel"] is True and values["tensor_parallel"] == 1:
        b.idle.append(Idle("sequence_parallel", "true: sequence parallelism follows tensor_parallel, which is 1 "
                                                "here, so there is nothing to split"))
    return b


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ParallelConfigError(f"parallelism.{name}: must be true or false, got {value!r}")
    return value


def _strategy(strategy: Any) -> str:
    if strategy in STRATEGIES:
        return strategy
    if strategy in ("optim", "optim_grads"):
        zero = 1 if strategy == "optim" else 2
        raise ParallelConfigError(
            f"parallelism.data_parallel_shard_strategy: {strategy!r} (ZeRO-{zero}: sharded optimizer "
            f"states{'' if zero == 1 else ' and gradients'} with replicated parameters) is not implemented; use "
            "'optim_grads_params' (ZeRO-3) or 'no_shard' (DDP)")
    raise ParallelConfigError(f"parallelism.data_parallel_shard_strategy: must be one of optim_grads_params, "
                              f"optim_grads, optim, no_shard, got {strategy!r}")


def _offload(b: _Build) -> bool:
    """cpu_offload as it acts: nothing to offload to on CPU; not implemented on accelerators."""
    offload = _flag("cpu_offload", b.values["cpu_offload"])
    if not offload or b.device is None:
        return offload
    if b.device == "CPU":
        b.idle.append(Idle("cpu_offload", "parameters and optimizer states already live in host memory on "
                                          "device_target CPU: nothing to offload"))
        return False
    raise ParallelConfigError(f"parallelism.cpu_offload: not supported by mf-parallel on {b.device} yet (no "
                              "host-offloaded parameter or optimizer path is implemented); set it to false")


def _world_split(values: dict[str, Any], world: int) -> ParallelDims:
    """The degrees on `world` ranks: data_parallel_shard -1 = pure FSDP over every data-parallel
    rank, s < dp = HSDP with dp / s replicas of s-way shards; `no_shard` makes every
    data-parallel rank a replica (DDP)."""
    tp, pp = values["tensor_parallel"], values["pipeline_parallel"]
    cp, ep, shard = values["context_parallel"], values["expert_parallel"], values["data_parallel_shard"]
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ParallelConfigError(f"world size must be a positive integer, got {world!r}")
    non_dp = pp * cp * tp
    if world % non_dp:
        raise ParallelConfigError(
            f"parallelism: pipeline_parallel ({pp}) x context_parallel ({cp}) x tensor_parallel ({tp}) = {non_dp} "
            f"does not divide the world size {world}; pick degrees whose product divides {world}")
    dp = world // non_dp
    declared = shard
    if shard == -1:
        shard = dp
    if dp % shard:
        raise ParallelConfigError(
            f"parallelism.data_parallel_shard: {shard} does not divide the data-parallel size {dp} "
            f"(= world {world} / (pp {pp} x cp {cp} x tp {tp})); use -1 or one of {divisors(dp)}")
    replicas = dp // shard
    if values["data_parallel_shard_strategy"] == "no_shard" and shard > 1:
        if declared > 1:
            raise ParallelConfigError(
                f"parallelism.data_parallel_shard: {declared} shards, but data_parallel_shard_strategy is 'no_shard'; "
                "leave data_parallel_shard at -1 or use 'optim_grads_params'")
        # Every data-parallel rank a replica. (ep stays: with dp_shard 1 it no longer divides
        # dp_shard x cp, and ParallelDims says so; the preflight's expert check names no_shard.)
        replicas, shard = dp, 1
    return ParallelDims(world_size=world, dp_replicate=replicas, dp_shard=shard, cp=cp, tp=tp, pp=pp, ep=ep)


def _fsdp(b: _Build, dims: ParallelDims | None, offload: bool) -> FsdpOptions:
    """FSDP's knobs; without data-parallel ranks (known only with a world) each is idle."""
    v = b.values
    policy = v["reshard_after_forward_policy"]
    if policy not in RESHARD_POLICIES:
        b.problems["reshard"] = (f"parallelism.reshard_after_forward_policy: must be one of "
                                 f"{', '.join(RESHARD_POLICIES)}, got {policy!r}")
        return None
    division = v["disable_gradient_division"]
    if not isinstance(division, bool):
        b.problems["division"] = f"parallelism.disable_gradient_division: must be true or false, got {division!r}"
        return None
    options = FsdpOptions(v["data_parallel_shard_strategy"], policy, division, offload)
    if dims is None or dims.fsdp_enabled or dims.dp_replicate > 1:
        return options
    for name in FSDP_FIELDS:
        value = v[name]
        if value != FIELDS[name]:
            b.idle.append(Idle(name, f"{value!r} only acts with data parallelism over several ranks; this layout "
                                     f"has none ({dims.describe()})"))
    return FsdpOptions(cpu_offload=offload)


def _pipeline(b: _Build) -> PipelineSpec:
    v = b.values
    pp = v["pipeline_parallel"]
    if pp == 1:
        for name in PIPELINE_FIELDS:
            b.unused(name, "pipeline_parallel > 1")
        return resolve_pipeline(1)
    return resolve_pipeline(pp, v["pipeline_parallel_schedule"], v["pipeline_parallel_interleave_num"],
                            dxdw_split=v["pipeline_parallel_enable_dxdw_split"],
                            overlap_p2p=v["pipeline_parallel_overlap_p2p"],
                            overlap_b_f=v["pipeline_parallel_overlap_b_f"])


def _context(b: _Build) -> ContextParallelSettings:
    v = b.values
    cp = v["context_parallel"]
    if cp == 1:
        for name in CONTEXT_FIELDS:
            b.unused(name, "context_parallel > 1")
        return ContextParallelSettings()
    method, degree, async_comm = v["context_parallel_method"], v["ulysses_degree_in_cp"], v["context_parallel_async"]
    settings = ContextParallelSettings(method, degree, v["context_parallel_mask_type"], async_comm)
    if async_comm and method == "ulysses":
        b.idle.append(Idle("context_parallel_async", "true has nothing to overlap with context_parallel_method "
                                                     "'ulysses' (its all-to-alls are on the attention's critical "
                                                     "path; the hook overlaps the ring's K/V exchange)"))
        async_comm = False
    elif async_comm and b.device == "CPU":
        # Kept (see the module docstring): the ring's order of operations, not its results.
        b.idle.append(Idle("context_parallel_async", "collectives are synchronous on device_target CPU, so nothing "
                                                     "overlaps (the ring still issues each step's K/V exchange first "
                                                     "and keeps one more K/V block alive)"))
    if method == "colossal" and degree not in (None, 1):
        b.idle.append(Idle("ulysses_degree_in_cp", f"{degree}: context_parallel_method 'colossal' is a pure ring, "
                                                   "with no Ulysses degree to act on"))
    elif method == "ulysses" and degree not in (None, cp):
        b.idle.append(Idle("ulysses_degree_in_cp", f"{degree}: context_parallel_method 'ulysses' spans every "
                                                   f"context-parallel rank ({cp}), with no Ulysses degree to choose; "
                                                   "'hybrid' nests Ulysses inside a ring"))
    if method != "hybrid":
        degree = None           # only hybrid nests Ulysses groups inside the ring
    return ContextParallelSettings(method, degree, settings.mask_type, async_comm)


def _dispatcher(b: _Build) -> DispatcherOptions:
    v = b.values
    ep, kind, groups = v["expert_parallel"], v["moe_token_dispatcher_type"], v["npu_nums_per_device"]
    if ep == 1:
        b.unused("moe_token_dispatcher_type", "expert_parallel > 1")
        b.unused("npu_nums_per_device", "expert_parallel > 1 and moe_token_dispatcher_type 'alltoall_deredundancy'")
        return DispatcherOptions()
    if kind not in EP_DISPATCHERS:
        raise ParallelConfigError(f"parallelism.moe_token_dispatcher_type: {kind!r} is not implemented; use one of "
                                  f"{', '.join(EP_DISPATCHERS)}")
    if isinstance(groups, bool) or not isinstance(groups, int):
        raise ParallelConfigError(f"parallelism.npu_nums_per_device: must be a positive integer, got {groups!r}")
    if kind == "alltoall_deredundancy":
        problem = deredundancy_problem(ep, groups)
        if problem:
            raise ParallelConfigError(f"parallelism.npu_nums_per_device: {problem}")
        return DispatcherOptions(kind, groups)
    if groups != FIELDS["npu_nums_per_device"]:
        b.idle.append(Idle("npu_nums_per_device", f"{groups} only acts with moe_token_dispatcher_type "
                                                  "'alltoall_deredundancy': nothing to act on with 'alltoall'"))
    return DispatcherOptions(kind)
