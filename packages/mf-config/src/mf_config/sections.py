"""The sections of the configuration reference (seeds/000), field by field, plus `context`.

Field names, types and defaults follow the reference's tables exactly; single-field rules
(positive, ranges, choices) sit next to the field. Rules that involve two fields or two
sections are in `mf_config.rules`. The extensions mf adds are in `mf_config.extensions`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from mf_config.errors import ConfigError
from mf_config.layer_spec import check_layers_per_stage_shape, parse_layer_spec
from mf_config.schema import (
    ExtraSection,
    Section,
    all_of,
    each,
    fld,
    in_range,
    non_empty,
    non_negative,
    positive,
    unique,
)

# ----------------------------------------------------------------------------- shared checks

def layer_specs(value: Any, path: str) -> Any:
    """`pre` hook: a list of quoted layer specs, well-formed, sorted and non-overlapping (the
    range against the model's layer count is checked later, in the rules)."""
    parse_layer_spec(value, None, path)
    return value


def module_layer_specs(value: Any, path: str) -> Any:
    """`pre` hook: a mapping of module path -> list of layer specs."""
    if not isinstance(value, dict):
        raise ConfigError(path, "must be a mapping of module path to layer specs, e.g. {attention: ['0-1']}", value)
    if not value:
        raise ConfigError(path, "must name at least one module (or be null)", value)
    for module, specs in value.items():
        if not isinstance(module, str) or not module.strip():
            raise ConfigError(path, "module paths must be non-empty strings", module)
        layer_specs(specs, f"{path}.{module}" if module.isidentifier() else f"{path}[{module!r}]")
    return value


def _file_prefix(value: str, path: str) -> None:
    if not value or value in (".", "..") or "/" in value or "\\" in value:
        raise ConfigError(path, "must be a non-empty file-name prefix without path separators", value)


# ----------------------------------------------------------------------------- context

def _device_mode(value: Any, path: str) -> Any:
    """`pre` hook: 'graph' / 'pynative' are spelled-out forms of 0 / 1."""
    if isinstance(value, str):
        modes = {"graph": 0, "pynative": 1}
        if value.lower() in modes:
            return modes[value.lower()]
        raise ConfigError(path, "must be 0 / 'graph' or 1 / 'pynative'", value)
    return value


def _mode_value(value: int, path: str) -> None:
    if value not in (0, 1):
        raise ConfigError(path, "must be 0 / 'graph' or 1 / 'pynative'", value)


@dataclass(kw_only=True)
class ContextConfig(Section):
    """Where and how MindSpore runs."""

    device_target: Literal["CPU", "Ascend", "GPU"] | None = fld(
        None, doc="CPU, Ascend or GPU; null = auto: the runtime picks from what is available")
    mode: int = fld(0, pre=_device_mode, check=_mode_value,
                    doc="0 or 'graph' (the trainer compiles the step), 1 or 'pynative'; stored as 0/1")
    device_id: int = fld(0, check=non_negative, doc="device index for a single-process run")


# ----------------------------------------------------------------------------- checkpoint

@dataclass(kw_only=True)
class CheckpointConfig(Section):
    """Saving and loading of weights and optimizer state."""

    enable_save: bool = fld(True, doc="save checkpoints")
    save_path: str = fld("", doc="save directory; empty = <output_dir>/checkpoint (resolved at load)")
    save_max: int = fld(5, check=positive, doc="checkpoints kept; older ones are deleted first")
    save_interleaved_steps: int = fld(1000, check=positive, doc="save every this many steps")
    no_save_optim: bool = fld(False, doc="save model weights only (no exact resume)")
    async_save: bool = fld(False, doc="write checkpoints in the background")
    prefix: str = fld("checkpoint", check=_file_prefix, doc="file-name prefix of saved files")
    remove_redundancy: bool = fld(False, doc="each replicated chunk is written by one rank only")
    load_path: str = fld("", doc="directory to load from; empty = start from scratch")
    load_balanced: bool = fld(False, doc="spread checkpoint reads across ranks")
    no_load_optim: bool = fld(False, doc="do not load optimizer state (must be False to resume)")
    load_worker_number: int = fld(1, check=positive, doc="loader threads")
    save_global_layout_cache: bool = fld(True, doc="cache the global layout to speed up later loads")
    load_rng_state: bool = fld(True, doc="extension: restore the RNG states a resumed checkpoint saved; false "
                                         "resumes without them (the RNGs restart from training.seed)")


# ----------------------------------------------------------------------------- training

def _seed(value: int, path: str) -> None:
    # numpy's RandomState and mindspore.set_seed take a 32-bit unsigned seed.
    if not 0 <= value < 2**32:
        raise ConfigError(path, "must be in [0, 2**32 - 1]", value)


@dataclass(kw_only=True)
class TrainingConfig(Section):
    """Run length, batch sizes, clipping, seed."""

    steps: int = fld(1000, check=positive, doc="total training steps")
    local_batch_size: int = fld(1, check=positive, doc="samples per device per micro-step")
    global_batch_size: int = fld(1, check=positive,
                                 doc="samples per optimizer step; gradient accumulation = "
                                     "global_batch_size // (data_parallel x local_batch_size)")
    max_norm: float = fld(1.0, check=positive, doc="gradient clipping norm (always applied; no off value)")
    seed: int = fld(42, check=_seed, doc="random seed")
    deterministic: bool = fld(False, doc="deterministic kernels (slower)")
    max_consecutive_nonfinite: int = fld(
        5, check=positive, doc="extension: stop after this many non-finite (NaN/Inf) steps in a row")
    max_skipped_fraction: float = fld(
        0.1, check=in_range(0.0, 1.0),
        doc="extension: a run that skipped more than this share of its steps (non-finite) fails; 1 = never")
    hang_timeout_s: float = fld(
        600.0, check=positive,
        doc="extension: under mf launch, a rank whose heartbeat stays silent this many seconds (stopped, frozen) "
            "ends the job with a line naming it and its step")


# ----------------------------------------------------------------------------- parallelism

def _shard_degree(value: int, path: str) -> None:
    if value != -1 and value < 1:
        raise ConfigError(path, "must be -1 (use the remaining devices) or a positive integer", value)


@dataclass(kw_only=True)
class ParallelismConfig(Section):
    """Multi-dimensional parallelism: FSDP/HSDP, TP (+SP), CP, PP, EP."""

    data_parallel_shard: int = fld(-1, check=_shard_degree, doc="FSDP shard degree; -1 = all remaining devices")
    data_parallel_shard_strategy: Literal["optim_grads_params", "optim_grads", "optim", "no_shard"] = fld(
        "optim_grads_params", doc="what FSDP shards: optimizer state, gradients, parameters (ZeRO-3 .. none)")
    reshard_after_forward_policy: Literal["always", "never", "default"] = fld(
        "default", doc="free gathered weights after forward; default = always without PP, never with PP")
    cpu_offload: bool = fld(False, doc="offload sharded parameters/gradients to host memory")
    disable_gradient_division: bool = fld(True, doc="FSDP reduces gradients by sum, not mean")
    tensor_parallel: int = fld(1, check=positive, doc="TP degree")
    context_parallel: int = fld(1, check=positive, doc="CP degree")
    context_parallel_method: Literal["colossal", "ulysses", "hybrid"] = fld("colossal", doc="CP implementation")
    context_parallel_async: bool = fld(False, doc="asynchronous CP communication hook")
    ulysses_degree_in_cp: int | None = fld(None, check=positive, doc="Ulysses degree inside CP; required for hybrid")
    context_parallel_mask_type: Literal["causal"] = fld("causal", doc="mask type of CP input preparation")
    pipeline_parallel: int = fld(1, check=positive, doc="PP stages")
    pipeline_parallel_layers_per_stage: Any = fld(
        None, pre=lambda v, p: (check_layers_per_stage_shape(v, p), v)[1],
        doc="layer placement: null/'auto', layer counts per virtual stage, or ranges per stage")
    pipeline_parallel_schedule: Literal["1f1b", "gpipe", "interleaved_1f1b", "zbv"] = fld(
        "1f1b", doc="PP schedule; 1f1b with pipeline_parallel_interleave_num > 1 is interleaved 1F1B; zbv = ZB-V")
    pipeline_parallel_interleave_num: int = fld(1, check=positive, doc="model chunks per stage")
    pipeline_parallel_overlap_p2p: bool = fld(False, doc="overlap stage-to-stage communication")
    pipeline_parallel_overlap_b_f: bool = fld(False, doc="overlap backward and forward compute")
    pipeline_parallel_enable_dxdw_split: bool = fld(False, doc="split dx/dw communication in PP")
    sequence_parallel: bool = fld(False, doc="SP follows TP (on whenever tensor_parallel > 1); True needs TP")
    expert_parallel: int = fld(1, check=positive, doc="EP degree (MoE)")
    npu_nums_per_device: int = fld(8, check=positive, doc="NPU ranks per machine")
    moe_token_dispatcher_type: Literal["alltoall", "alltoall_deredundancy"] = fld(
        "alltoall", doc="MoE token dispatch")


# ----------------------------------------------------------------------------- optimizer / lr

def _betas_length(value: list, path: str) -> None:
    if not 1 <= len(value) <= 2:
        raise ConfigError(path, "must hold one or two coefficients", value)


@dataclass(kw_only=True)
class OptimizerConfig(ExtraSection):
    """Optimizer; undeclared keys go to the optimizer's constructor."""

    type: str = fld("AdamW", check=non_empty, doc="optimizer class, e.g. AdamW, Muon")
    betas: list[float] = fld([0.9, 0.95], check=all_of(_betas_length, each(in_range(0.0, 1.0, high_open=True))),
        doc="moment coefficients, each in [0, 1)")
    eps: float = fld(1.0e-8, check=positive, doc="numerical stability term")
    weight_decay: float = fld(0.01, check=non_negative, doc="weight decay")
    weight_decay_include: list[str] | None = fld(None, check=each(non_empty),
                                                 doc="parameter-name rules forced to decay")
    weight_decay_exclude: list[str] | None = fld(None, check=each(non_empty),
                                                 doc="parameter-name rules forced not to decay")


@dataclass(kw_only=True)
class LrSchedulerConfig(ExtraSection):
    """Learning-rate schedule; undeclared keys (warmup_ratio, min_lr, ...) go to the scheduler."""

    type: str | None = fld(None, check=non_empty, doc="scheduler class; null = constant learning_rate")
    learning_rate: float = fld(1e-5, check=non_negative, doc="base learning rate")


# ----------------------------------------------------------------------------- datasets

@dataclass(kw_only=True)
class DataloaderConfig(ExtraSection):
    """The data loader; undeclared keys (datasets_type, sizes, config, ...) go to the loader."""

    type: str | None = fld(None, check=non_empty, doc="loader class, e.g. BlendedMegatronDatasetDataLoader")
    shuffle: bool = fld(False, doc="shuffle samples")
    column_names: list[str] = fld(["input_ids", "labels"], check=all_of(non_empty, unique, each(non_empty)),
                                  doc="columns of each sample")
    python_multiprocessing: bool = fld(False, doc="use Python worker processes")


@dataclass(kw_only=True)
class TrainDatasetConfig(Section):
    """Training data."""

    dataloader: DataloaderConfig = fld(DataloaderConfig(), doc="the loader (allow_extra)")
    drop_remainder: bool = fld(True, doc="drop a last incomplete batch")
    num_parallel_workers: int = fld(8, check=positive, doc="loader workers")
    prefetch_size: int = fld(1, check=positive, doc="batches prefetched")
    numa_enable: bool = fld(False, doc="NUMA-affine loading")


# ----------------------------------------------------------------------------- model

@dataclass(kw_only=True)
class ModelConfig(ExtraSection):
    """Model; every structure hyper-parameter other than the two below is passed through."""

    model_type: str | None = fld(None, check=non_empty, doc="model family, e.g. llama, qwen3, deepseek_v3")
    architectures: str | None = fld(None, check=non_empty, doc="architecture class, e.g. DeepseekV3ForCausalLM")

    @property
    def num_hidden_layers(self) -> int | None:
        """The declared layer count (pass-through key), or None when the YAML does not say."""
        value = self.extra.get("num_hidden_layers")
        return value if isinstance(value, int) and not isinstance(value, bool) else None


# ----------------------------------------------------------------------------- monitor / profiler

@dataclass(kw_only=True)
class TrainStateConfig(Section):
    local_norm: str = fld("", doc="local norm name")
    local_loss: bool = fld(False, doc="per-rank loss monitoring")
    device_norm: bool = fld(False, doc="per-device norm monitoring")
    device_loss: bool = fld(False, doc="per-device loss monitoring")


@dataclass(kw_only=True)
class MoeMonitorConfig(Section):
    save_tokens_per_expert_interval: int | None = fld(None, check=positive,
                                                      doc="record tokens per expert every N steps; null = off")
    target_layers: list[int] | None = fld(None, check=all_of(each(non_negative), unique),
                                          doc="layers whose MoE routing is recorded")


@dataclass(kw_only=True)
class MonitorConfig(Section):
    """Training-state, MoE and logging monitors."""

    train_state: TrainStateConfig = fld(TrainStateConfig())
    moe_monitor: MoeMonitorConfig = fld(MoeMonitorConfig())
    log_interval: int = fld(1, check=positive, doc="extension: log metrics every N steps")
    tensorboard: bool = fld(True, doc="extension: write TensorBoard events under <output_dir>")
    peak_flops_per_device: float | None = fld(
        None, check=positive, doc="extension: peak FLOP/s of one device for MFU; null = known/measured")


@dataclass(kw_only=True)
class ProfilerConfig(Section):
    """Performance profiling over a step window."""

    enable_profiling: bool = fld(False, doc="collect a profile")
    start_step: int = fld(1, check=positive, doc="first profiled step")
    end_step: int = fld(1, check=positive, doc="last profiled step (>= start_step)")
    output_path: str | None = fld(None, check=non_empty, doc="result directory; null = generated")
    profiler_rank: list[int] | None = fld(None, check=all_of(non_empty, each(non_negative), unique),
                                          doc="ranks profiled; null = all")
    profiler_level: int = fld(0, check=in_range(0, 2), doc="detail level 0, 1 or 2")
    mstx: bool = fld(False, doc="lightweight markers")
    profile_memory: bool = fld(False, doc="tensor memory data")
    with_stack: bool = fld(True, doc="Python call stacks")
    profile_cpu: bool = fld(True, doc="CPU activity")


# ----------------------------------------------------------------------------- memory

@dataclass(kw_only=True)
class RecomputeConfig(Section):
    """Activation recomputation."""

    mode: Literal["None", "full", "select"] = fld("None", doc="'None', 'full' or 'select'")
    full_recompute_layer: list[str] | None = fld(None, pre=layer_specs,
                                                 doc="layer specs recomputed whole; required for full")
    select_module: dict[str, list[str]] | None = fld(None, pre=module_layer_specs,
                                                     doc="module path -> layer specs; required for select")


@dataclass(kw_only=True)
class RecomputeCommConfig(Section):
    """Recomputation of communication operators."""

    enable: bool = fld(False, doc="recompute communication operators")
    select_module: dict[str, list[str]] | None = fld(None, pre=module_layer_specs,
                                                     doc="module path -> layer specs; required when enabled")


@dataclass(kw_only=True)
class LayerSwapConfig(Section):
    layers: list[str] = fld(pre=layer_specs, doc="layer specs offloaded whole")


@dataclass(kw_only=True)
class OpSwapConfig(Section):
    op_name: str = fld(check=non_empty, doc="module whose activations are offloaded")
    layers: list[str] = fld(pre=layer_specs, doc="layer specs")


@dataclass(kw_only=True)
class SwapConfig(Section):
    """Activation offload to host memory."""

    enable: bool = fld(False, doc="offload activations")
    default_prefetch: int = fld(1, check=positive, doc="operators of look-ahead; in [1, num_hidden_layers - 1]")
    layer_swap: list[LayerSwapConfig] | None = fld(None, doc="whole-layer offload entries")
    op_swap: list[OpSwapConfig] | None = fld(None, doc="operator offload entries")


# ----------------------------------------------------------------------------- callbacks

@dataclass(kw_only=True)
class CallbackConfig(ExtraSection):
    """One extra callback; undeclared keys go to its constructor."""

    type: str = fld(check=non_empty, doc="registered callback class name (required)")
