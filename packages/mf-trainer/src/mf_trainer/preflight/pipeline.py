"""`pipeline_parallel > 1`: the schedule and its flags, the layers of every stage against the
model, the micro-batch count against the schedule, and what does not combine with pipeline stages
yet (pipeline_step.py runs the rest). The knobs' refusals at pipeline_parallel 1 are
parallel.py's `feature_knobs`; pipeline x context parallelism is refused by context.py.

Stages combine with FSDP over each stage's data-parallel group (`optim_grads_params`), with DDP
replicas (`no_shard`: each stage's gradients all-reduced over its dp group) and with tensor
parallelism (the stage's layers under the TP plan, vocabulary-split logits on the last stage): all
proven against one process in the dist tests under 1f1b. What is proven with pipeline ranks alone
(gpipe, interleaved, the dx/dw split, zbv) and HSDP stages stay refused with data- or
tensor-parallel stages, one keyed line each."""

from __future__ import annotations

from mf_trainer.preflight.registry import check, split_line

# Model keys that make a model MoE (mixtral, qwen3_moe / qwen2_moe, deepseek_v3).
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
# Degrees that do not combine with pipeline stages yet, and why.
NOT_WITH_PIPELINE = {
    "expert_parallel": "the stages' MoE layers are not wired for the all-to-all dispatcher yet",
}
# Schedules proven with data or tensor parallelism inside the stages (dist tests vs one process).
WITH_SHARDED_STAGES = ("1f1b",)


def _pp(t) -> int:
    return t.cfg.parallelism.pipeline_parallel


def _spec(t):
    """The resolved PipelineSpec, or the ParallelConfigError line."""
    import mf_parallel as mp

    return mp.pipeline_from_config(t.cfg.parallelism)


@check()
def pipeline_schedule(t):
    """The pipeline schedule and its flags are a combination that runs."""
    if _pp(t) <= 1:
        return
    import mf_parallel as mp

    try:
        _spec(t)
    except mp.ParallelConfigError as exc:
        yield split_line(str(exc), "parallelism.pipeline_parallel")


@check()
def pipeline_layers(t):
    """pipeline_parallel_layers_per_stage places the model's layers on the virtual stages."""
    if _pp(t) <= 1 or t.model_args is None:
        return
    import mf_config
    import mf_parallel as mp

    try:
        spec = _spec(t)
    except mp.ParallelConfigError:
        return                                           # pipeline_schedule says why
    try:
        layers = mf_config.pipeline_layer_placement(t.cfg.parallelism.pipeline_parallel_layers_per_stage, spec.pp,
                                                    spec.chunks, t.model_args.num_hidden_layers,
                                                    schedule=spec.schedule)
        mp.StageLayout.build(spec, layers)
    except (mf_config.ConfigError, mp.ParallelConfigError) as exc:
        yield split_line(str(exc), "parallelism.pipeline_parallel_layers_per_stage")


@check(needs=("world",))
def pipeline_microbatches(t):
    """The micro-batch count (the accumulation count) suits the schedule."""
    if _pp(t) <= 1 or t.dims is None:
        return
    import mf_parallel as mp
    from mf_trainer.preflight.data import accumulation

    try:
        spec = _spec(t)
        count = accumulation(t.cfg.training, t.dims.dp)
        if count >= 1:                                   # below one: data.global_batch says why
            spec.check_microbatches(count)
    except mp.ParallelConfigError as exc:
        yield split_line(str(exc), "parallelism.pipeline_parallel_schedule")


@check()
def pipeline_combinations(t):
    """What pipeline stages do not combine with yet."""
    if _pp(t) <= 1:
        return
    cfg, par = t.cfg, t.cfg.parallelism
    for key, why in NOT_WITH_PIPELINE.items():
        if getattr(par, key) > 1:
            yield (f"parallelism.{key}", f"{getattr(par, key)} with pipeline_parallel {par.pipeline_parallel} is not "
                                         f"implemented ({why}); set one of them to 1")
    experts = [k for k in MOE_KEYS if (cfg.model.extra.get(k) or 0) > 0]
    if experts:
        yield ("parallelism.pipeline_parallel",
               f"pipeline stages of a MoE model ({experts[0]}: {cfg.model.extra[experts[0]]}) are not implemented "
               "yet (its routing statistics and balance loss do not travel between stages); set it to 1")


@check(needs=("world",))
def pipeline_sharded_stages(t):
    """Data- or tensor-parallel stages run only in the combinations proven against one process."""
    if _pp(t) <= 1 or t.dims is None or (t.dims.dp == 1 and t.dims.tp == 1):
        return
    import mf_parallel as mp

    try:
        spec = _spec(t)
    except mp.ParallelConfigError:
        return                                           # pipeline_schedule says why
    par, dims = t.cfg.parallelism, t.dims
    inside = ("FSDP" if dims.fsdp_enabled else "data-parallel" if dims.dp > 1 else "") + \
             (" x " if dims.dp > 1 and dims.tp > 1 else "") + ("TP" if dims.tp > 1 else "")
    proven = f"(only {' and '.join(WITH_SHARDED_STAGES)} with FSDP, DDP or TP stages is proven against one process)"
    if spec.chunks > 1 and spec.schedule != "zbv":
        yield ("parallelism.pipeline_parallel_interleave_num",
               f"{par.pipeline_parallel_interleave_num} chunks per rank with {inside} stages are not implemented "
               f"{proven}; set it to 1")
    elif spec.schedule not in WITH_SHARDED_STAGES:
        yield ("parallelism.pipeline_parallel_schedule",
               f"{spec.schedule!r} with {inside} stages is not implemented {proven}; use '1f1b'")
    if par.pipeline_parallel_enable_dxdw_split:
        yield ("parallelism.pipeline_parallel_enable_dxdw_split",
               f"true with {inside} stages is not implemented (the deferred weight gradients are proven with "
               f"pipeline ranks alone); set it to false")
    if dims.dp_replicate > 1 and dims.dp_shard > 1:
        # DDP stages (no_shard) are proven (PP2 x DDP2); HSDP needs 8 ranks to test, not run yet.
        yield ("parallelism.data_parallel_shard",
               f"HSDP ({dims.describe()}) inside pipeline stages is not proven against one process yet (FSDP or "
               f"DDP stages are); shard over the whole data-parallel group (data_parallel_shard: -1) or replicate "
               f"(data_parallel_shard_strategy: no_shard)")
    if t.cfg.eval_dataset is not None:
        # The stages' forward-only evaluation is proven with pipeline ranks alone (PP2 1f1b).
        yield ("eval_dataset", f"evaluation during training with {inside} pipeline stages is not proven against one "
                               "process yet; drop eval_dataset (eval_dataset=null) and evaluate the checkpoint with "
                               "`mf eval`")
