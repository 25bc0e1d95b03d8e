"""Expert parallelism (`parallelism.expert_parallel` > 1): what the Trainer runs, and what it
refuses with its reason.

Runs: the experts of every MoE layer split over ep ranks carved out of the data-parallel ranks
(Megatron's layout; mf_parallel.shard_experts), tokens exchanged by the `alltoall` dispatcher
(mf_parallel.AllToAllTokenDispatcher) or by the two-level `alltoall_deredundancy` one (mf_parallel.
DeredundancyTokenDispatcher: device groups of npu_nums_per_device ep ranks, which must tile the ep
group), non-expert weights FSDP-sharded (or under the TP plan) as without EP. Proven (loss parity
in the dist session) for ep = the data-parallel size (no two ranks hold the same experts; EP2, and
EP4 with deredundancy over groups of 2), for ep smaller than it (expert data parallelism: each
expert block FSDP-sharded over the dp_shard / ep ranks holding it, its gradient reduced there;
EP2 x FSDP2 on 4 ranks), beside tensor parallelism (EP2 x TP2: experts replicated over tp, their
gradients all-reduced there; with either dispatcher: each tp rank exchanges its own sequence
shard's tokens within its own ep group, which is what the two-level dispatcher splits into device
groups), beside context parallelism (CP2 x EP2: the ep ranks are the cp ranks, each routing its own
sequence chunks), with evaluation during training (every rank evaluates every batch through the
exchange; EP2), and in pipeline stages (PP2 x EP2 on 4 ranks, alltoall; and the seed's layout kinds
TP2 x PP2 x EP2 over FSDP2 on 8 ranks with alltoall_deredundancy: `moe_seed_layout`; which
pipeline layouts of a MoE model run is preflight/pipeline.py's). Refused, one keyed line each: a
model without routed experts, an expert count ep does not divide, an npu_nums_per_device that does
not divide ep under `alltoall_deredundancy` (or is set without it), deredundancy beside cp or with
ep below the data-parallel ranks (not run against one process yet), HSDP or `no_shard`. That ep
divides dp_shard x cp is ParallelDims' own check (the `layout` check reports it).
"""

from __future__ import annotations

import mf_parallel as mp
from mf_trainer.preflight.context import has_routed_experts
from mf_trainer.preflight.registry import TRAINING, Notice, check

_EXPERT_COUNT_FIELDS = ("n_routed_experts", "num_local_experts", "num_experts")
KEY = "parallelism.expert_parallel"


def _ep(t) -> int:
    return t.cfg.parallelism.expert_parallel


@check(commands=TRAINING)
def expert_parallel_model(t):
    """Expert parallelism needs routed experts that ep divides."""
    ep, args = _ep(t), t.model_args
    if ep <= 1 or args is None:
        return
    if not has_routed_experts(args):
        yield KEY, f"{ep} > 1, but model {t.cfg.model.model_type!r} has no routed MoE layers to split; set it to 1"
        return
    field = next(f for f in _EXPERT_COUNT_FIELDS if getattr(args, f, None))
    experts = getattr(args, field)
    if experts % ep:
        options = [d for d in range(1, experts + 1) if experts % d == 0]
        yield KEY, f"{ep} does not divide model.{field} = {experts} (each rank holds experts / ep); use one of {options}"


@check(commands=TRAINING)
def expert_parallel_dispatcher(t):
    """Both dispatchers run; deredundancy's device groups of npu_nums_per_device ranks tile ep (the
    seed's ep >= npu_nums_per_device is mf-config's own check), and the field acts only there."""
    par, ep = t.cfg.parallelism, _ep(t)
    if ep <= 1:
        return      # feature_knobs (parallel.py) refuses the knobs without ep
    if par.moe_token_dispatcher_type not in mp.EP_DISPATCHERS:
        yield ("parallelism.moe_token_dispatcher_type", f"{par.moe_token_dispatcher_type!r} is not implemented; use "
                                                        f"one of {', '.join(mp.EP_DISPATCHERS)}")
    elif par.moe_token_dispatcher_type == "alltoall_deredundancy":
        problem = mp.deredundancy_problem(ep, par.npu_nums_per_device)
        if problem:
            yield "parallelism.npu_nums_per_device", problem
    elif par.npu_nums_per_device != type(par)().npu_nums_per_device:
        yield Notice("parallelism.npu_nums_per_device", f"{par.npu_nums_per_device} only acts with "
                                                        "moe_token_dispatcher_type 'alltoall_deredundancy': nothing to "
                                                        "act on with 'alltoall'")


@check(commands=TRAINING)
def expert_parallel_combinations(t):
    """Expert parallelism runs beside data, tensor, context and pipeline parallelism (no no_shard;
    which pipeline stages: preflight/pipeline.py)."""
    par, ep = t.cfg.parallelism, _ep(t)
    if ep <= 1:
        return
    if par.data_parallel_shard_strategy == "no_shard":
        yield ("parallelism.data_parallel_shard_strategy", f"'no_shard' with expert_parallel {ep}: the ep ranks are "
                                                           "carved out of the FSDP shard ranks; use "
                                                           "'optim_grads_params'")


@check(commands=TRAINING, needs=("world",))
def expert_parallel_layout(t):
    """ep over the FSDP shard ranks, any divisor of them (expert data parallelism); HSDP beside EP is not proven."""
    dims, ep = t.dims, _ep(t)
    if ep <= 1 or dims is None:
        return
    if dims.dp_replicate > 1:
        yield KEY, (f"{ep} with data-parallel replicas (HSDP: data_parallel_shard {dims.dp_shard} of {dims.dp}) is not "
                    "proven yet (the experts' gradients would be all-reduced over the replicas); use "
                    "data_parallel_shard -1")
    elif t.cfg.parallelism.moe_token_dispatcher_type == "alltoall_deredundancy" and dims.cp > 1:
        yield ("parallelism.moe_token_dispatcher_type", f"'alltoall_deredundancy' with context_parallel {dims.cp} is not "
                                                        "proven yet (the two-level dispatcher is proven with ep over "
                                                        "the data-parallel ranks); use 'alltoall' beside context "
                                                        "parallelism")
    elif t.cfg.parallelism.moe_token_dispatcher_type == "alltoall_deredundancy" and ep < dims.dp_shard:
        yield ("parallelism.moe_token_dispatcher_type", f"'alltoall_deredundancy' with expert_parallel {ep} below the "
                                                        f"{dims.dp_shard} data-parallel ranks is not proven yet (the "
                                                        "two-level dispatcher is proven with ep over every "
                                                        f"data-parallel rank); use 'alltoall' or expert_parallel "
                                                        f"{dims.dp_shard}")
