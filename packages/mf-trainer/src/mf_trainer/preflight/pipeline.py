"""`pipeline_parallel > 1`: the schedule and its flags, the layers of every stage against the
model, the micro-batch count against the schedule, and what does not combine with pipeline stages
yet (pipeline_step.py runs the rest). The knobs' refusals at pipeline_parallel 1 are
parallel.py's `feature_knobs`; pipeline x context parallelism is refused by context.py.

Stages combine with FSDP over each stage's data-parallel group (`optim_grads_params`) and with
tensor parallelism (the stage's layers under the TP plan, vocabulary-split logits on the last
stage) under every schedule (gpipe, 1f1b, interleaved, the dx/dw split, zbv) and with evaluation
during training, and with DDP replicas (`no_shard`: each stage's gradients all-reduced over its dp
group) under 1f1b: proven against one process in the dist tests. DDP stages under the other
schedules or with evaluation, and HSDP stages, stay refused, one keyed line each.

MoE models (each stage's balance loss in its own backward, every stage's loads in the bias
update): proven with one rank per stage (PP2, `moe_pp2`), under tensor parallelism (PP2 x TP2,
`moe_pp2_tp2`) and with each stage's experts over all of its data-parallel ranks with either
dispatcher (PP2 x EP2, `moe_pp2_ep2`, alltoall; TP2 x PP2 x EP2 over FSDP2 with
alltoall_deredundancy and both overlap flags, `moe_seed_layout`: the seed's parallelism example
scaled to 8 ranks). Refused: transformers' switch loss (it does not split into stages), and other
data-parallel layouts of MoE stages (FSDP / DDP stages without EP, expert data parallelism)."""

from __future__ import annotations

from mf_trainer.preflight.context import has_routed_experts
from mf_trainer.preflight.registry import check, split_line

# FSDP and TP stages run under every schedule and with evaluation during training: proven against
# one process on 4 ranks (tests-integration/dist: pp2_fsdp2, pp2_tp2, pp2_gpipe_tp2,
# pp2_interleaved_split_fsdp2, pp2_zbv_fsdp2, pp2_zbv_tp2). Data-parallel replicas are not yet.


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
    yield from _moe_stages(t)


def _moe_stages(t):
    """MoE pipeline stages: each stage's balance loss in its own backward, the routing loads summed
    over stages for the expert-bias update (pipeline_step.py). Proven against one process on the
    tiny DeepSeek-V3 (sequence-wise balance loss, bias update) under PP2 1f1b (`moe_pp2`), and
    with the stages under tensor parallelism (`moe_pp2_tp2`: each tp rank's share of its stage's
    balance loss from the whole sequences' counts); transformers' switch loss cannot be split into
    stages."""
    args, par = t.model_args, t.cfg.parallelism
    if not has_routed_experts(args):
        return
    if getattr(args, "output_router_logits", False):
        yield ("parallelism.pipeline_parallel",
               f"{par.pipeline_parallel} with model.output_router_logits true is not implemented: transformers' "
               "switch balance loss pools every MoE layer's routing before one product, so it does not split "
               "into pipeline stages; set output_router_logits: false or pipeline_parallel: 1")


@check(needs=("world",))
def pipeline_moe_data_parallel(t):
    """MoE stages run with one rank per stage, or with their experts split over every data-parallel
    rank of the stage (expert_parallel = the FSDP shard ranks, either dispatcher): the layouts proven."""
    dims = t.dims
    if _pp(t) <= 1 or dims is None or dims.dp == 1 or not has_routed_experts(t.model_args):
        return
    if dims.ep == dims.dp_shard and dims.dp_replicate == 1:
        if t.cfg.eval_dataset is not None:
            # Proven: evaluation in MoE stages of one rank each (moe_pp2) and under EP without stages
            # (moe_ep2); both at once would cost the 4-rank launch its eval batches through the exchange.
            yield ("eval_dataset", "evaluation during training in MoE pipeline stages with expert parallelism is not "
                                   "proven against one process yet (it is with one rank per stage); drop "
                                   "eval_dataset (eval_dataset=null) or evaluate the checkpoints with mf eval")
        return
    yield ("parallelism.pipeline_parallel",
           f"{_pp(t)} with data-parallel ranks ({dims.describe()}) in a MoE model is not proven against one process "
           f"yet (MoE stages are proven with one rank per stage, or with expert_parallel over all {dims.dp} "
           f"data-parallel ranks of a stage); set expert_parallel: {dims.dp} or pipeline_parallel: 1")


@check(needs=("world",))
def pipeline_sharded_stages(t):
    """Data-parallel stages run only in the layouts proven against one process (FSDP; any schedule)."""
    if _pp(t) <= 1 or t.dims is None or t.dims.dp == 1:
        return
    import mf_parallel as mp

    dims = t.dims
    ddp = dims.dp_replicate > 1 and dims.dp_shard == 1
    if ddp:
        # DDP stages are proven under 1f1b without evaluation (pp2_ddp2); the rest is FSDP's
        # mechanism with a shard group of one, but not run against one process yet.
        try:
            spec = _spec(t)
        except mp.ParallelConfigError:
            return                                       # pipeline_schedule says why
        par, why = t.cfg.parallelism, "(DDP stages are proven against one process under 1f1b only)"
        if spec.chunks > 1 or spec.schedule != "1f1b":
            yield ("parallelism.pipeline_parallel_schedule",
                   f"{spec.schedule!r}{' with ' + str(spec.chunks) + ' chunks per rank' if spec.chunks > 1 else ''} "
                   f"with DDP (no_shard) stages is not proven yet {why}; use '1f1b' or FSDP stages "
                   "(data_parallel_shard_strategy: optim_grads_params)")
        if par.pipeline_parallel_enable_dxdw_split:
            yield ("parallelism.pipeline_parallel_enable_dxdw_split",
                   f"true with DDP (no_shard) stages is not proven yet {why}; set it to false or use FSDP stages")
        if t.cfg.eval_dataset is not None:
            yield ("eval_dataset", f"evaluation during training with DDP (no_shard) pipeline stages is not proven yet "
                                   f"{why}; drop eval_dataset (eval_dataset=null) or use FSDP stages")
        if dims.tp > 1:
            yield ("parallelism.data_parallel_shard_strategy",
                   f"'no_shard' (DDP) with tensor_parallel {dims.tp} inside pipeline stages is not proven yet {why} "
                   "(TP stages are proven with FSDP); use 'optim_grads_params'")
    if dims.dp_replicate > 1 and dims.dp_shard > 1:
        # DDP stages (no_shard) are proven (PP2 x DDP2); HSDP needs 8 ranks to test, not run yet.
        yield ("parallelism.data_parallel_shard",
               f"HSDP ({dims.describe()}) inside pipeline stages is not proven against one process yet (FSDP or "
               f"DDP stages are); shard over the whole data-parallel group (data_parallel_shard: -1) or replicate "
               f"(data_parallel_shard_strategy: no_shard)")
