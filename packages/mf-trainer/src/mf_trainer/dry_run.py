"""`mf train CONFIG --dry-run`: what a run would do, without doing it or writing anything.

    plan = mf_trainer.dry_run(cfg, world=8, device="CPU", build_model=True)
    print("\\n".join(plan.lines()))

Runs the preflight for the world the run would have (default: this process's, as the launcher
announces it; `world=N` checks a launch layout from one process), resolves the layout, the
accumulation and the tokens per optimizer step, lists where outputs would go and what the run
directory holds (a new run, this run resumed at step N, or what `--overwrite` would remove), and with
`build_model` builds the model (MindSpore; weights not initialised) to count its parameters: total,
trainable (a LoRA fine-tune adds its adapters and freezes the rest) and per rank. Per rank is
exact for data-parallel layouts (FSDP splits dim 0 of every parameter, padded to a multiple of the
shard count; DDP and replicas hold everything); with tensor_parallel > 1 the model's plan decides
which weights split, which only the ranks themselves apply, so it is not computed from one process.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mf_trainer.environment import world_size_from_env
from mf_trainer.preflight import PreflightReport, preflight
from mf_trainer.preflight.data import accumulation
from mf_trainer.preflight.registry import LAUNCH, TRAIN, model_section


@dataclass
class DryRun:
    report: PreflightReport
    world: int
    layout: str = ""
    accumulation: int = 0
    global_batch: int = 0
    tokens_per_step: int = 0
    outputs: dict[str, str] = field(default_factory=dict)
    parameters: dict[str, int | str] = field(default_factory=dict)
    memory: list[str] = field(default_factory=list)
    start: str = ""                       # the run directory's verdict (rundir.RunDirectory.describe)
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"layout: {self.layout}"]
        if self.accumulation:
            out.append(f"batch: {self.accumulation} micro-batch(es) per step x data-parallel ranks x local_batch_size "
                       f"= {self.global_batch} samples; {self.tokens_per_step} tokens per step")
        if self.parameters:
            out.append("parameters: " + ", ".join(f"{k} {v}" if isinstance(v, str) else f"{k} {v:,}"
                                                  for k, v in self.parameters.items()))
        out += self.memory
        out += [f"{what}: {where}" for what, where in self.outputs.items()]
        if self.start:
            out.append(f"start: {self.start}")
        out += self.notes
        out += self.report.notice_lines()
        out += [f"not checked: {line}" for line in self.report.skipped]
        return out


def _seq_length(cfg) -> int | None:
    config = cfg.train_dataset.dataloader.extra.get("config")
    value = config.get("seq_length") if isinstance(config, dict) else None
    return value if isinstance(value, int) else None


def _count_parameters(cfg, layout) -> dict[str, int | str]:
    """Build the model (no weight init) and count; LoRA adapters are added as the run would."""
    import mf_models

    model = mf_models.build_model(model_section(cfg), init=False, mtp=True)   # as the run builds it
    if cfg.lora is not None:
        import mf_config

        lora = cfg.lora
        excluded = list(mf_config.parse_layer_spec(lora.exclude_layers or [], model.args.num_hidden_layers,
                                                   "lora.exclude_layers"))
        mf_models.apply_lora(model, lora.target_modules, lora.lora_rank, lora.lora_alpha, lora.lora_dropout,
                             excluded, seed=cfg.training.seed)
    params = [p for _, p in model.parameters_and_names()]
    counts: dict[str, int | str] = {"total": sum(p.size for p in params),
                                    "trainable": sum(p.size for p in model.trainable_params())}
    dims = layout.dims
    if dims.tp > 1:
        counts["per rank"] = "not computed from one process with tensor_parallel > 1"
    elif dims.pp > 1:
        counts["per rank"] = _pipeline_rank_counts(layout, model)
    else:
        shard = dims.dp_shard * dims.cp      # FSDP shards over dp_shard x cp
        counts["per rank"] = sum(math.ceil(p.shape[0] / shard) * math.prod(p.shape[1:]) if p.shape else 1
                                 for p in params)
    return counts


def _pipeline_rank_counts(layout, model) -> str:
    """Parameters each pipeline rank holds (its layers; embedding, norm and head where its stages
    have them; the last stage's copy of a tied table counted where it lives)."""
    import mf_config

    spec = layout.pipeline
    stages = layout.stage_layout(model.args.num_hidden_layers, mf_config.pipeline_layer_placement)
    sizes = {name: p.size for name, p in model.parameters_and_names()}
    tied = "output.weight" not in sizes
    parts = []
    for rank in range(spec.pp):
        infos = stages.chunks(rank)
        layers = {str(i) for info in infos for i in info.layers}
        first, last = any(i.first for i in infos), any(i.last for i in infos)
        held = sum(size for name, size in sizes.items()
                   if (name.startswith("layers.") and name.split(".")[1] in layers)
                   or (name.startswith("tok_embeddings.") and (first or (last and tied)))
                   or (not name.startswith(("layers.", "tok_embeddings.")) and last))
        parts.append(f"pp rank {rank}: {held}")
    return ", ".join(parts)


def dry_run(cfg, world: int | None = None, device: str | None = None, *, build_model: bool = False,
            source: str | None = None, overwrite: bool = False) -> DryRun:
    """The plan of a training run (see the module docstring); problems raise PreflightError."""
    from mf_trainer.rundir import inspect_run
    from mf_trainer.session import outputs
    from mf_trainer.sources import complete_model_section

    world = world_size_from_env() if world is None else world
    device = device or cfg.context.device_target
    command = TRAIN if world == 1 else LAUNCH
    cfg, model_note = complete_model_section(cfg)
    report = preflight(cfg, command, world, device, source=source, overwrite=overwrite, plan_only=True)
    report.raise_for_problems()
    layout = report.layout          # the section resolved once, by the preflight, for this world and device
    dims = layout.dims
    plan = DryRun(report, world, layout=dims.describe())
    plan.accumulation = accumulation(cfg.training, dims.dp)
    plan.global_batch = plan.accumulation * dims.dp * cfg.training.local_batch_size
    seq = _seq_length(cfg)
    plan.tokens_per_step = plan.global_batch * seq if seq else 0
    plan.outputs = outputs(cfg)
    plan.start = inspect_run(cfg, overwrite=overwrite).describe()
    plan.notes = [model_note] if model_note else []
    if build_model:
        plan.parameters = _count_parameters(cfg, layout)
    plan.memory = _memory(cfg, layout)
    return plan


def _memory(cfg, layout) -> list[str]:
    """The per-rank memory estimate (mf_trainer.memory), or the reason it is not made."""
    from mf_trainer.errors import TrainerConfigError
    from mf_trainer.memory import memory_plan

    try:
        return memory_plan(cfg, layout).lines()
    except TrainerConfigError as exc:
        return [f"memory: not estimated: {exc}"]
