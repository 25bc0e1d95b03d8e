"""Context parallelism (`parallelism.context_parallel` > 1): what the Trainer runs, and what it
refuses with its reason.

The Trainer slices every micro-batch along the sequence for its cp rank (mf_parallel.
slice_for_context_parallel: zigzag chunks, global RoPE positions, packed documents - the dense
reset_attention_mask or the compressed actual_seq_len, which preflight/data.py lets through only
under cp - as global segment ids), the model's plan replaces its attention cores by the cp method, and FSDP shards over
dp_shard x cp (its reduce-scatter adds the cp ranks' gradients of their sequence chunks).
Refused: settings mf-parallel's layout rejects (method, mask type, async, Ulysses degree), a
method the model's heads or the sequence length cannot split, cp with pipeline parallelism, cp
with `no_shard` (the cp ranks' gradients are added by FSDP). The cp knobs with nothing to act on
(async beside Ulysses or on CPU's synchronous collectives, a Ulysses degree beside a pure method)
are the layout's idle fields: one notice each (parallel.py). MoE models train under cp: each rank routes
its own chunks' tokens, and the balance loss takes the whole sequences' counts (summed over the cp
ranks) with each rank's own score sums, so the ranks' shares add up to one process's loss
(mf_models: `SplitSequences`). Evaluation during training runs: each
rank evaluates its chunks of every sequence and the sums are added over cp (mf_trainer.evaluation).
"""

from __future__ import annotations

from mf_trainer.preflight.registry import TRAINING, check, split_line

# Argument fields that give a model routed experts (mixtral, qwen3_moe, deepseek_v3).
_EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts")


def _cp(t) -> int:
    return t.layout.cp if t.layout is not None else 1


def has_routed_experts(args) -> bool:
    """Whether the model's arguments build at least one MoE layer."""
    if args is None or not any(getattr(args, f, None) for f in _EXPERT_FIELDS):
        return False
    first_dense = getattr(args, "first_k_dense_replace", 0) or 0
    return first_dense < args.num_hidden_layers


def train_seq_length(cfg) -> int | None:
    """The training sequence length (train_dataset.dataloader.config.seq_length, else model.seq_length)."""
    config = cfg.train_dataset.dataloader.extra.get("config")
    seq = config.get("seq_length") if isinstance(config, dict) else None
    if seq is None:
        seq = cfg.model.extra.get("seq_length")
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None


@check()
def context_parallel_settings(t):
    """The context_parallel_* fields hold values mf-parallel accepts."""
    line = t.layout_problems.get("context")
    if line:
        yield split_line(line, "parallelism.context_parallel_method")


@check()
def context_parallel_combinations(t):
    """Context parallelism runs without pipeline stages and no_shard."""
    cp = _cp(t)
    if cp <= 1:
        return
    if t.layout.pp > 1:
        yield ("parallelism.context_parallel", f"{cp} with pipeline_parallel {t.layout.pp} is not "
                                               "implemented (pipeline stages have no context-parallel attention); "
                                               "use one of them")
    if t.layout.fsdp is not None and t.layout.fsdp.strategy == "no_shard":
        yield ("parallelism.data_parallel_shard_strategy", "'no_shard' with context_parallel > 1: the cp ranks' "
                                                           "gradients are added by FSDP, which shards over "
                                                           "dp_shard x cp; use 'optim_grads_params'")


@check(commands=TRAINING, needs=("world",))
def context_parallel_split(t):
    """The cp method splits the model's heads and the training sequence."""
    import mf_parallel as mp

    args, dims = t.model_args, t.dims
    if _cp(t) <= 1 or args is None or dims is None or t.layout.context is None:
        return      # (a refused cp setting: context_parallel_settings says why)
    settings = t.layout.context
    heads = args.num_attention_heads
    kv_heads = getattr(args, "num_key_value_heads", None) or heads
    if heads % dims.tp or kv_heads % dims.tp and kv_heads > dims.tp:
        return      # tensor_parallel_split says why
    local_kv = max(kv_heads // dims.tp, 1)
    for line in mp.context_parallel_problems(dims, settings, heads // dims.tp, local_kv, train_seq_length(t.cfg)):
        yield split_line(line, "parallelism.context_parallel")
