"""Context parallelism (`parallelism.context_parallel` > 1): what the Trainer runs, and what it
refuses with its reason.

The Trainer slices every micro-batch along the sequence for its cp rank (mf_parallel.
slice_for_context_parallel: zigzag chunks, global RoPE positions, packed documents - the dense
reset_attention_mask or the compressed actual_seq_len, which preflight/data.py lets through only
under cp - as global segment ids), the model's plan replaces its attention cores by the cp method, and FSDP shards over
dp_shard x cp (its reduce-scatter adds the cp ranks' gradients of their sequence chunks).
Refused: settings mf-parallel rejects (method, mask type, async, Ulysses degree), a method the
model's heads or the sequence length cannot split, cp with pipeline parallelism, cp with
`no_shard` (the cp ranks' gradients are added by FSDP). MoE models train under cp: each rank routes
its own chunks' tokens, and the balance loss takes the whole sequences' counts (summed over the cp
ranks) with each rank's own score sums, so the ranks' shares add up to one process's loss
(mf_models: `SplitSequences`). Evaluation during training runs: each
rank evaluates its chunks of every sequence and the sums are added over cp (mf_trainer.evaluation).
"""

from __future__ import annotations

from mf_trainer.preflight.registry import TRAINING, Notice, check, split_line

# Argument fields that give a model routed experts (mixtral, qwen3_moe, deepseek_v3).
_EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts")


def _cp(t) -> int:
    return t.cfg.parallelism.context_parallel


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
    import mf_parallel as mp

    if _cp(t) <= 1:
        return
    try:
        mp.ContextParallelSettings.from_config(t.cfg.parallelism)
    except mp.ParallelConfigError as exc:
        yield split_line(str(exc), "parallelism.context_parallel_method")


@check()
def context_parallel_knobs(t):
    """context_parallel_async and ulysses_degree_in_cp act with the methods that have a ring / nest Ulysses."""
    par = t.cfg.parallelism
    if _cp(t) <= 1:
        return      # parallel.py's feature_knobs says it of every cp knob
    if par.context_parallel_async and par.context_parallel_method == "ulysses":
        yield Notice("parallelism.context_parallel_async", "true has nothing to overlap with context_parallel_method "
                                                           "'ulysses' (its all-to-alls are on the attention's critical "
                                                           "path; the hook overlaps the ring's K/V exchange)")
    if par.context_parallel_method == "colossal" and par.ulysses_degree_in_cp not in (None, 1):
        yield Notice("parallelism.ulysses_degree_in_cp", f"{par.ulysses_degree_in_cp}: context_parallel_method "
                                                         "'colossal' is a pure ring, with no Ulysses degree to act on")


@check(needs=("device",))
def context_parallel_async_device(t):
    """context_parallel_async overlaps where collectives are asynchronous (not on CPU)."""
    par = t.cfg.parallelism
    if (_cp(t) > 1 and par.context_parallel_async and par.context_parallel_method != "ulysses"
            and t.device == "CPU"):
        yield Notice("parallelism.context_parallel_async", "collectives are synchronous on device_target CPU, so "
                                                           "nothing overlaps (the ring still issues each step's K/V "
                                                           "exchange first and keeps one more K/V block alive)")


@check()
def context_parallel_combinations(t):
    """Context parallelism runs without pipeline stages and no_shard."""
    par, cp = t.cfg.parallelism, _cp(t)
    if cp <= 1:
        return
    if par.pipeline_parallel > 1:
        yield ("parallelism.context_parallel", f"{cp} with pipeline_parallel {par.pipeline_parallel} is not "
                                               "implemented (pipeline stages have no context-parallel attention); "
                                               "use one of them")
    if par.data_parallel_shard_strategy == "no_shard":
        yield ("parallelism.data_parallel_shard_strategy", "'no_shard' with context_parallel > 1: the cp ranks' "
                                                           "gradients are added by FSDP, which shards over "
                                                           "dp_shard x cp; use 'optim_grads_params'")


@check(commands=TRAINING, needs=("world",))
def context_parallel_split(t):
    """The cp method splits the model's heads and the training sequence."""
    import mf_parallel as mp

    args, dims = t.model_args, t.dims
    if _cp(t) <= 1 or args is None or dims is None:
        return
    try:
        settings = mp.ContextParallelSettings.from_config(t.cfg.parallelism)
    except mp.ParallelConfigError:
        return      # context_parallel_settings says why
    heads = args.num_attention_heads
    kv_heads = getattr(args, "num_key_value_heads", None) or heads
    if heads % dims.tp or kv_heads % dims.tp and kv_heads > dims.tp:
        return      # tensor_parallel_split says why
    local_kv = max(kv_heads // dims.tp, 1)
    for line in mp.context_parallel_problems(dims, settings, heads // dims.tp, local_kv, train_seq_length(t.cfg)):
        yield split_line(line, "parallelism.context_parallel")
