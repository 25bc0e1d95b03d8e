"""`mf plan CONFIG [--world N] [--set KEY=VALUE ...] [--costs F,B,W] [--p2p MODE] [--png PATH]`.

What a training YAML will do on N ranks, without running it (and without importing MindSpore):
the parallel layout, the pipeline stages (layers per rank and chunk), the chosen schedule's
per-rank action timeline, its bubble (idle time of the busiest stage, as a fraction of the step,
next to the textbook formula where one exists) and the activations each rank holds at once.
The numbers come from the same action lists the executor runs (mf-parallel's `build_schedule`),
timed with unit costs F, B (input gradient), W (weight gradient) per chunk.

The report is a list of sections (`SECTIONS`), each a function of one `Plan`: a later section
(e.g. a memory estimate) is one more entry.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mf_cli.errors import UsageError


def add_parser(subparsers, name: str, help_text: str) -> None:
    p = subparsers.add_parser(name, help=help_text, description=help_text)
    p.add_argument("config", help="training YAML")
    p.add_argument("--world", type=int, metavar="N",
                   help="ranks of the job (default: the smallest world the degrees need, data-parallel size 1)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key before validation (repeatable), e.g. parallelism.pipeline_parallel=4")
    p.add_argument("--costs", default="1,1,1", metavar="F,B,W",
                   help="time of one forward, input-gradient and weight-gradient pass of one chunk (default 1,1,1; "
                        "an unsplit backward costs B+W)")
    p.add_argument("--p2p", default="async", choices=("async", "blocking", "rendezvous"),
                   help="p2p semantics of the timing: async (overlapped, the textbook's), blocking (receives wait "
                        "at their Comm), rendezvous (both ranks wait for each other: MCCL on CPU)")
    p.add_argument("--png", metavar="PATH", help="also draw the timeline into a PNG (matplotlib)")
    p.add_argument("--width", type=int, metavar="CHARS", help="characters per time unit in the text timeline")
    p.add_argument("--device-memory", metavar="SIZE",
                   help="memory of one device (e.g. 64GB): say whether the layout's peak fits, and with --layouts "
                        "which candidate layouts do")
    p.add_argument("--layouts", action="store_true",
                   help="also tabulate the per-rank memory of candidate layouts of --world (tensor x pipeline x "
                        "data-parallel degrees, recompute none / full)")
    p.set_defaults(run=run)


@dataclass
class Plan:
    """Everything a section may print (None where the layout has no pipeline)."""

    config: Any
    args: Any
    dims: Any
    spec: Any
    microbatches: int
    micro_batch_rule: str
    layout: Any = None
    layout_note: str = ""
    schedule: Any = None
    simulation: Any = None
    costs: Any = None
    notes: list[str] = field(default_factory=list)


def _default_world(par) -> int:
    shard = par.data_parallel_shard if par.data_parallel_shard > 0 else 1
    return par.pipeline_parallel * par.tensor_parallel * par.context_parallel * shard


def _microbatches(training, dp: int) -> tuple[int, str]:
    # The Trainer's rule (one micro-batch of local_batch_size per data-parallel rank per micro-step);
    # mf-trainer cannot be imported here: it pulls in MindSpore.
    per_micro = dp * training.local_batch_size
    if per_micro > training.global_batch_size:
        raise UsageError(f"training.global_batch_size: {training.global_batch_size} is below data-parallel size ({dp}) "
                         f"x local_batch_size ({training.local_batch_size}) = {per_micro}")
    m = training.global_batch_size // per_micro
    return m, (f"training.global_batch_size {training.global_batch_size} / (data-parallel size {dp} x "
               f"local_batch_size {training.local_batch_size})")


# The preflight problems about what a plan shows (the layout, the model it cuts, the batch
# arithmetic, recompute); the data and output sections a plan does not need may be incomplete.
PLAN_KEYS = ("parallelism", "model", "training", "recompute")


def _refused_layout(config, world: int, source: str) -> None:
    """What `mf launch -n WORLD` would refuse about the layout, refused here too (a plan of a layout
    that cannot run is no plan): the same preflight, without this machine's files."""
    import mf_trainer
    from mf_cli.checks import completed

    report = mf_trainer.preflight(completed(config), "launch", world, config.context.device_target, source=source,
                                  files=False, plan_only=True)
    lines = [f"{key}: {reason}" for key, reason in report.problems if key.split(".")[0].split("[")[0] in PLAN_KEYS]
    if lines:
        raise UsageError("\n".join(lines))


def build_plan(args) -> Plan:
    import mf_config
    import mf_parallel as mp

    try:
        config = mf_config.load_config(args.config, overrides=args.overrides)
    except mf_config.ConfigError as exc:
        raise UsageError(str(exc)) from None
    par = config.parallelism
    world = args.world if args.world is not None else _default_world(par)
    if world < 1:
        raise UsageError(f"--world: must be a positive integer, got {world}")
    _refused_layout(config, world, args.config)
    try:
        dims = mp.ParallelDims.from_config(par, world)
        spec = mp.pipeline_from_config(par)
        costs = mp.Costs.parse(args.costs)
    except mp.ParallelConfigError as exc:
        raise UsageError(f"{exc} (planning for {world} rank{'s' if world > 1 else ''})") from None
    m, rule = _microbatches(config.training, dims.dp)
    plan = Plan(config=config, args=args, dims=dims, spec=spec, microbatches=m, micro_batch_rule=rule, costs=costs)
    if spec.pp == 1:
        return plan
    layers = config.num_hidden_layers
    if layers is None:
        plan.layout_note = "model.num_hidden_layers is not set: the layers of each stage are unknown"
    else:
        try:
            placement = mf_config.pipeline_layer_placement(
                par.pipeline_parallel_layers_per_stage, spec.pp, par.pipeline_parallel_interleave_num, layers,
                schedule=spec.schedule)
            plan.layout = mp.StageLayout.build(spec, placement)
        except (mf_config.ConfigError, mp.ParallelConfigError) as exc:
            raise UsageError(str(exc)) from None
    try:
        plan.schedule = mp.build_schedule(spec, m)
        mp.validate_schedule(plan.schedule)
        plan.simulation = mp.simulate_schedule(plan.schedule, costs, args.p2p)
    except mp.ParallelConfigError as exc:
        raise UsageError(str(exc)) from None
    return plan


# ----------------------------------------------------------------------------- sections
def layout_section(plan: Plan) -> list[str]:
    lines = [f"layout: {plan.dims.describe()}"]
    if plan.spec.pp == 1:
        lines.append("pipeline: none (pipeline_parallel is 1: every rank holds every layer)")
        return lines
    lines.append(f"pipeline: {plan.spec.describe()}")
    if plan.layout is not None:
        lines += ["  " + row for row in plan.layout.describe().splitlines()]
        tied = (getattr(plan.config.model, "extra", None) or {}).get("tie_word_embeddings", False)
        if len(plan.layout.tied_ranks) > 1 and tied is True:
            ranks = " and ".join(map(str, plan.layout.tied_ranks))
            lines.append(f"  tied embeddings: a copy of the table on pipeline ranks {ranks}, gradients summed")
    else:
        lines.append("  " + plan.layout_note)
    lines.append(f"micro-batches per step: {plan.microbatches} (= {plan.micro_batch_rule})")
    return lines


def schedule_section(plan: Plan) -> list[str]:
    if plan.simulation is None:
        return []
    import mf_parallel as mp
    from mf_parallel.pipeline import Combined, overlap_b_f_idle_reason, textbook_bubble

    sim, c = plan.simulation, plan.costs
    backward = "B (input gradient) + W (weight gradient)" if plan.schedule.split_backward else f"B+W = {c.B + c.W}"
    lines = [f"timeline ({plan.args.p2p} p2p; costs F={c.F} B={c.B} W={c.W}, backward {backward}):"]
    try:
        lines += ["  " + row for row in mp.text_timeline(sim, width=plan.args.width).splitlines()]
    except mp.ParallelConfigError as exc:
        if plan.args.width is not None:           # asked for: the user's number cannot be honoured
            raise UsageError(f"--width {plan.args.width}: {exc}") from None
        lines.append(f"  not drawn as text: {exc}")
    lines.append("per rank: busy, idle (waiting inside its span), span, peak activations in flight (micro-batch x chunk)")
    for line in sim.ranks:
        lines.append(f"  rank {line.rank}: busy {_num(line.busy)}  idle {_num(line.idle)}  span {_num(line.span)}  "
                     f"peak {line.peak_in_flight}")
    text = f"bubble: {sim.bubble_fraction:.4f} of the step (idle {_num(sim.bubble)} on the busiest stage)"
    known = textbook_bubble(plan.schedule, c) if plan.args.p2p == "async" else None
    if known is not None:
        text += f"; textbook {known[0]} = {_num(known[1])}"
    lines.append(text)
    pairs = [a for rank in plan.schedule.ranks for a in rank if isinstance(a, Combined)]
    if pairs:
        kind = "a backward and the next forward" if pairs[0].backward_first else "a forward and another chunk's backward"
        lines.append(f"overlap_b_f: {len(pairs)} pairs ({kind}) run combined")
    elif plan.schedule.overlap_b_f:
        lines.append(f"overlap_b_f: changes nothing here, {overlap_b_f_idle_reason(plan.schedule)}")
    return lines


def memory_section(plan: Plan) -> list[str]:
    """Per-rank parameter, gradient, optimizer-state and activation bytes (mf_trainer.memory_plan)."""
    import mf_trainer
    from mf_trainer.memory import parse_bytes

    try:
        device = parse_bytes(plan.args.device_memory) if plan.args.device_memory else None
    except mf_trainer.TrainerConfigError as exc:
        raise UsageError(str(exc)) from None
    try:
        memory = mf_trainer.memory_plan(plan.config, plan.dims.world_size)
    except mf_trainer.TrainerConfigError as exc:
        return [f"memory: not estimated: {exc}"]
    lines = memory.lines(device)
    if plan.args.layouts:
        from mf_trainer.memory import candidate_layouts

        lines += candidate_layouts(plan.config, plan.dims.world_size, device)
    return lines


def _num(x) -> str:
    value = float(x)
    return str(int(value)) if value.is_integer() else f"{value:.3g}"


SECTIONS: list[tuple[str, Callable[[Plan], list[str]]]] = [
    ("layout", layout_section),
    ("schedule", schedule_section),
    ("memory", memory_section),
]


def _check_args(args) -> None:
    """What the flags themselves get wrong, before any planning."""
    import os

    if args.width is not None and args.width < 1:
        raise UsageError(f"--width: must be a positive integer, got {args.width}")
    if args.png is not None:
        if os.path.isdir(args.png):
            raise UsageError(f"--png: {args.png} is a directory; give the file to draw into, e.g. "
                             f"{os.path.join(args.png, 'timeline.png')}")
        if not args.png.lower().endswith(".png"):
            raise UsageError(f"--png: {args.png} is not a .png file name (the timeline is drawn as a PNG)")


def run(args) -> int:
    _check_args(args)
    plan = build_plan(args)
    out: list[str] = []
    for _, section in SECTIONS:
        out += section(plan)
    sys.stdout.write("\n".join(out) + "\n")
    if args.png:
        if plan.simulation is None:
            raise UsageError("--png: there is no pipeline schedule to draw (pipeline_parallel is 1)")
        import mf_parallel as mp
        from mf_parallel.pipeline import save_png

        try:
            save_png(plan.simulation, args.png, title=f"{plan.spec.describe()}, {plan.microbatches} micro-batches")
        except mp.ParallelConfigError as exc:
            raise UsageError(str(exc)) from None
        print(f"timeline drawn in {args.png}")
    return 0
