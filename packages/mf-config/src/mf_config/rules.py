"""Rules that involve more than one field: within a section, or across sections.

`check_rules(cfg)` runs them in a fixed order (the model's shape first, since later rules check
layer indices and head counts against it) and raises `ConfigError` for the first broken one.
Each rule is documented in the package README ("Rules").
"""

from __future__ import annotations

from mf_config.config import TrainConfig
from mf_config.data_rules import check_dataloader
from mf_config.errors import ConfigError
from mf_config.layer_spec import parse_layer_spec, pipeline_layer_placement
from mf_config.schema import child_path

# Pass-through model keys whose meaning is common to every model family: when present they must
# be positive integers, because the rules below (and every model) do arithmetic with them.
MODEL_POSITIVE_INT_KEYS = (
    "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
    "vocab_size", "seq_length", "n_routed_experts", "num_experts", "num_experts_per_tok",
)


def check_rules(cfg: TrainConfig) -> None:
    _model(cfg)
    _training(cfg)
    _parallelism(cfg)
    _pipeline(cfg)
    _optimizer(cfg)
    _datasets(cfg)
    _monitor(cfg)
    _profiler(cfg)
    _recompute(cfg)
    _swap(cfg)
    _lora(cfg)
    _inference(cfg)


def _int_extra(section, key: str) -> int | None:
    value = section.extra.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# ----------------------------------------------------------------------------- model / training

def _model(cfg: TrainConfig) -> None:
    model = cfg.model
    for key in MODEL_POSITIVE_INT_KEYS:
        if key in model.extra:
            value = model.extra[key]
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"model.{key}", "must be a positive integer", value)
    # A fine-tune may leave the model to its base (mf-trainer reads load_path's config.json).
    from_base = cfg.run_mode == "finetune" and bool(cfg.checkpoint.load_path)
    if model.model_type is None and model.architectures is None and not from_base:
        raise ConfigError("model.model_type", "the model needs a model_type (or architectures) to build it"
                          + (" (a run_mode finetune with checkpoint.load_path may omit the model section: it is "
                             "then the base's)" if cfg.run_mode == "finetune" else ""))
    experts = _int_extra(model, "n_routed_experts") or _int_extra(model, "num_experts")
    per_token = _int_extra(model, "num_experts_per_tok")
    if experts is not None and per_token is not None and per_token > experts:
        raise ConfigError("model.num_experts_per_tok", f"must not exceed the number of experts ({experts})", per_token)


def _training(cfg: TrainConfig) -> None:
    t, shard = cfg.training, cfg.parallelism.data_parallel_shard
    # The reference: data_parallel x local_batch_size <= global_batch_size. data_parallel is only
    # known at run time unless data_parallel_shard fixes it; it is at least 1 either way.
    data_parallel = shard if shard > 0 else 1
    if data_parallel * t.local_batch_size > t.global_batch_size:
        what = (f"parallelism.data_parallel_shard x training.local_batch_size = {data_parallel * t.local_batch_size}"
                if shard > 0 else f"training.local_batch_size ({t.local_batch_size})")
        raise ConfigError("training.global_batch_size", f"must be >= {what}", t.global_batch_size)


# ----------------------------------------------------------------------------- parallelism

def _parallelism(cfg: TrainConfig) -> None:
    p = cfg.parallelism
    heads = _int_extra(cfg.model, "num_attention_heads")
    if p.moe_token_dispatcher_type == "alltoall_deredundancy" and p.expert_parallel < p.npu_nums_per_device:
        raise ConfigError(
            "parallelism.expert_parallel",
            f"must be >= parallelism.npu_nums_per_device ({p.npu_nums_per_device}) when "
            "moe_token_dispatcher_type is 'alltoall_deredundancy'",
            p.expert_parallel,
        )
    # sequence_parallel follows tensor_parallel (the reference: on whenever TP is, not switchable);
    # a value saying otherwise is a notice of mf-trainer's preflight, not an error.
    if heads is not None and heads % p.tensor_parallel:
        raise ConfigError("parallelism.tensor_parallel",
                          f"must divide model.num_attention_heads ({heads})", p.tensor_parallel)
    _context_parallel(cfg, heads)
    _expert_parallel(cfg)


def _context_parallel(cfg: TrainConfig, heads: int | None) -> None:
    p = cfg.parallelism
    cp, degree, method = p.context_parallel, p.ulysses_degree_in_cp, p.context_parallel_method
    path = "parallelism.ulysses_degree_in_cp"
    if method == "ulysses" and degree not in (None, cp):
        raise ConfigError(path, f"must equal context_parallel ({cp}) with context_parallel_method 'ulysses'", degree)
    if method == "hybrid":
        if degree is None:
            raise ConfigError(path, "is required with context_parallel_method 'hybrid'", degree)
        if not 1 < degree < cp or cp % degree:
            raise ConfigError(path, f"must satisfy 1 < degree < context_parallel ({cp}) and divide it "
                                    "with context_parallel_method 'hybrid'", degree)
    if method == "ulysses" and p.context_parallel_async and heads is not None and heads % cp:
        raise ConfigError("parallelism.context_parallel",
                          f"must divide model.num_attention_heads ({heads}) with asynchronous Ulysses CP", cp)


def _expert_parallel(cfg: TrainConfig) -> None:
    p = cfg.parallelism
    ep = p.expert_parallel
    experts = _int_extra(cfg.model, "n_routed_experts") or _int_extra(cfg.model, "num_experts")
    if ep > 1 and experts is not None and experts % ep:
        raise ConfigError("parallelism.expert_parallel", f"must divide the model's number of experts ({experts})", ep)
    if p.data_parallel_shard > 0:
        # Experts live on the dp_shard x cp x tp devices: EP must tile them exactly.
        grid = p.data_parallel_shard * p.context_parallel * p.tensor_parallel
        if grid % ep:
            raise ConfigError("parallelism.expert_parallel",
                              f"must divide data_parallel_shard x context_parallel x tensor_parallel ({grid})", ep)


def _pipeline(cfg: TrainConfig) -> None:
    p = cfg.parallelism
    pp = p.pipeline_parallel
    # The pipeline knobs at pipeline_parallel 1 have nothing to act on: mf-trainer's preflight says
    # so in one notice line each (they change no result). What cannot run anywhere is refused here.
    schedule, interleave = p.pipeline_parallel_schedule, p.pipeline_parallel_interleave_num
    if schedule == "gpipe" and interleave > 1:
        raise ConfigError("parallelism.pipeline_parallel_interleave_num",
                          "must be 1 with pipeline_parallel_schedule 'gpipe' (interleaving is a 1f1b schedule)",
                          interleave)
    if schedule == "interleaved_1f1b" and interleave == 1:
        raise ConfigError("parallelism.pipeline_parallel_schedule",
                          "interleaved_1f1b needs pipeline_parallel_interleave_num > 1 (model chunks per stage); set "
                          "it, or use '1f1b'", schedule)
    if schedule == "zbv":
        if interleave not in (1, 2):
            raise ConfigError("parallelism.pipeline_parallel_interleave_num",
                              "zbv places exactly two model chunks per stage in a V; set it to 1 or 2", interleave)
    layers, value = cfg.num_hidden_layers, p.pipeline_parallel_layers_per_stage
    if pp == 1 or ((value is None or value == "auto") and layers is None):
        return
    # Raises for a placement that does not fit the model; every virtual stage gets >= 1 layer.
    pipeline_layer_placement(value, pp, interleave, layers, "parallelism.pipeline_parallel_layers_per_stage",
                             schedule=schedule)


# ----------------------------------------------------------------------------- optimizer / data

def _optimizer(cfg: TrainConfig) -> None:
    o = cfg.optimizer
    both = set(o.weight_decay_include or ()) & set(o.weight_decay_exclude or ())
    if both:
        name = sorted(both)[0]
        raise ConfigError("optimizer.weight_decay_exclude", "names a rule weight_decay_include also names", name)


def _datasets(cfg: TrainConfig) -> None:
    training_run = cfg.run_mode in ("train", "finetune")
    if training_run and cfg.train_dataset.dataloader.type is None:
        raise ConfigError("train_dataset.dataloader.type",
                          "is required: name the loader class, e.g. BlendedMegatronDatasetDataLoader")
    check_dataloader(cfg.train_dataset.dataloader, "train_dataset.dataloader", cfg.model)
    ev = cfg.eval_dataset
    if ev is None:
        return
    if ev.dataloader.type is None:
        raise ConfigError("eval_dataset.dataloader.type",
                          "is required: name the loader class, e.g. BlendedMegatronDatasetDataLoader")
    check_dataloader(ev.dataloader, "eval_dataset.dataloader", cfg.model)
    # An eval_interval beyond training.steps is fine: the run evaluates after its last step anyway
    # (as Megatron does), so a short run of a long recipe still gets its evaluation.


# ----------------------------------------------------------------------------- monitor / profiler

def _monitor(cfg: TrainConfig) -> None:
    layers = cfg.num_hidden_layers
    targets = cfg.monitor.moe_monitor.target_layers or []
    for i, layer in enumerate(targets):
        if layers is not None and layer >= layers:
            raise ConfigError(f"monitor.moe_monitor.target_layers[{i}]",
                              f"is out of range: model.num_hidden_layers is {layers}", layer)


def _profiler(cfg: TrainConfig) -> None:
    prof = cfg.profiler
    if prof.start_step > prof.end_step:
        raise ConfigError("profiler.end_step", f"must be >= profiler.start_step ({prof.start_step})", prof.end_step)
    # A window reaching past training.steps is cut at the last step (mf-trainer's preflight says so).


# ----------------------------------------------------------------------------- memory

def _module_specs(modules: dict[str, list[str]] | None, layers: int | None, path: str) -> None:
    for module, specs in (modules or {}).items():
        parse_layer_spec(specs, layers, child_path(path, module))


def _recompute(cfg: TrainConfig) -> None:
    r, layers = cfg.recompute, cfg.num_hidden_layers
    if r.mode == "full" and not r.full_recompute_layer:
        raise ConfigError("recompute.full_recompute_layer", "is required (non-empty) when recompute.mode is 'full'",
                          r.full_recompute_layer)
    if r.mode == "select" and not r.select_module:
        raise ConfigError("recompute.select_module", "is required when recompute.mode is 'select'", r.select_module)
    if r.full_recompute_layer:
        parse_layer_spec(r.full_recompute_layer, layers, "recompute.full_recompute_layer")
    _module_specs(r.select_module, layers, "recompute.select_module")
    rc = cfg.recompute_comm
    if rc.enable and not rc.select_module:
        raise ConfigError("recompute_comm.select_module", "is required when recompute_comm.enable is True",
                          rc.select_module)
    _module_specs(rc.select_module, layers, "recompute_comm.select_module")


def _swap(cfg: TrainConfig) -> None:
    s, layers = cfg.swap, cfg.num_hidden_layers
    if s.enable and not (s.layer_swap or s.op_swap):
        raise ConfigError("swap.enable", "True needs swap.layer_swap or swap.op_swap to say what to offload", True)
    # The reference's range [1, num_layers - 1]; a one-layer model still takes the default 1.
    top = max(1, layers - 1) if layers is not None else None
    if s.enable and top is not None and not 1 <= s.default_prefetch <= top:
        raise ConfigError("swap.default_prefetch",
                          f"must be in [1, model.num_hidden_layers - 1] = [1, {top}]", s.default_prefetch)
    owner: dict[int, int] = {}
    for i, entry in enumerate(s.layer_swap or []):
        path = f"swap.layer_swap[{i}].layers"
        for layer in parse_layer_spec(entry.layers, layers, path):
            if layer in owner:
                raise ConfigError(path, f"layer {layer} is already offloaded by swap.layer_swap[{owner[layer]}]",
                                  entry.layers)
            owner[layer] = i
    op_owner: dict[tuple[str, int], int] = {}
    for i, entry in enumerate(s.op_swap or []):
        path = f"swap.op_swap[{i}].layers"
        for layer in parse_layer_spec(entry.layers, layers, path):
            if layer in owner:
                raise ConfigError(path, f"layer {layer} is offloaded whole by swap.layer_swap[{owner[layer]}], "
                                        f"its {entry.op_name!r} with it", entry.layers)
            key = (entry.op_name, layer)
            if key in op_owner:
                raise ConfigError(path, f"layer {layer} of {entry.op_name!r} is already offloaded by "
                                        f"swap.op_swap[{op_owner[key]}]", entry.layers)
            op_owner[key] = i


# ----------------------------------------------------------------------------- extensions

def _lora(cfg: TrainConfig) -> None:
    if cfg.lora is not None and cfg.lora.exclude_layers:
        parse_layer_spec(cfg.lora.exclude_layers, cfg.num_hidden_layers, "lora.exclude_layers")


def _inference(cfg: TrainConfig) -> None:
    inf = cfg.inference
    if inf.prompts is not None and inf.input_file is not None:
        raise ConfigError("inference.input_file", "give inference.prompts or inference.input_file, not both",
                          inf.input_file)
    vocab = _int_extra(cfg.model, "vocab_size")
    for i, token in enumerate(inf.stop_token_ids or []):
        if vocab is not None and token >= vocab:
            raise ConfigError(f"inference.stop_token_ids[{i}]", f"must be below model.vocab_size ({vocab})", token)
    if cfg.run_mode == "predict":
        if inf.prompts is None and inf.input_file is None:
            raise ConfigError("inference.prompts", "run_mode predict needs inference.prompts or inference.input_file")
        if not cfg.tokenizer.path:
            raise ConfigError("tokenizer.path", "run_mode predict needs a tokenizer to turn prompts into tokens", "")
