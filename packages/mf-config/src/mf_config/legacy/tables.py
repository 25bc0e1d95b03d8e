"""Rule tables for the keys of the older format that mf does not carry over, with the reason.

A `Drop` says why a key is not carried. Its `noop` values lose nothing (they mean "off" in the old
format, or are what mf does anyway): they are reported as `unneeded`; any other value as `dropped`.
`always=True` marks keys that never lose anything (bookkeeping of the old runtime); `gate` names
a sibling switch: when the switch is off, the key had no effect either.

The tables are data on purpose: adding a key of some MindFormers release is one line here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mf_config.errors import fmt_value


@dataclass(frozen=True)
class Drop:
    reason: str
    noop: tuple = ()
    always: bool = False
    gate: str | None = None  # sibling key whose falsy value made this key inert

    def verdict(self, value: Any, siblings: dict | None = None) -> tuple[str, str]:
        """(kind, message) for `value`; `siblings` is the mapping holding the key (for `gate`)."""
        if self.always:
            return "unneeded", self.reason
        if any(_same(value, v) for v in self.noop):
            return "unneeded", f"{fmt_value(value)} loses nothing: {self.reason}"
        if self.gate is not None and not (siblings or {}).get(self.gate):
            return "unneeded", f"{self.gate} is off, so nothing is lost: {self.reason}"
        return "dropped", self.reason


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same kind (so that False does not match 0)."""
    return type(a) is type(b) and a == b


def lookup(table: dict, key: Any, default: Any = None) -> Any:
    """`table.get(key, default)` that tolerates an unhashable key from a malformed file (a list
    where a name belongs): such a key is simply not in the table."""
    try:
        return table.get(key, default)
    except TypeError:
        return default


def gone(reason: str, *noop: Any, gate: str | None = None) -> Drop:
    """Not carried; `noop` values lose nothing."""
    return Drop(reason, tuple(noop), gate=gate)


def moot(reason: str) -> Drop:
    """Not carried, and nothing is lost whatever the value."""
    return Drop(reason, always=True)


_NO_STRATEGY = "mf writes no strategy files: each checkpoint's metadata records its own layout"
_AUTOTUNE = "only used by dataset auto-tuning, which mf does not have"

TOP_LEVEL: dict[str, Drop] = {
    "auto_trans_ckpt": moot("mf reshards a checkpoint on load to any parallel layout; there is no switch"),
    "src_strategy_path_or_dir": moot(_NO_STRATEGY),
    "only_save_strategy": gone(_NO_STRATEGY, False),
    "load_ckpt_async": gone("mf loads checkpoints synchronously (checkpoint.load_worker_number sets the reader "
                            "threads)", False),
    "remove_redundancy": moot("mf's checkpoint metadata says which chunks each file holds; loading needs no flag"),
    "use_legacy": moot("it chose between MindFormers' two model implementations; mf has one per model"),
    "remote_save_url": gone("uploading to AICC/OBS is not part of mf: copy output_dir yourself", "", None),
    "auto_tune": gone("MindSpore dataset auto-tuning has no equivalent (train_dataset.num_parallel_workers and "
                      "prefetch_size are set by hand)", False),
    "filepath_prefix": moot(_AUTOTUNE),
    "autotune_per_step": moot(_AUTOTUNE),
    "layer_scale": gone("layer-wise learning-rate decay is not supported", False),
    "layer_decay": gone("layer-wise learning-rate decay is not supported", gate="layer_scale"),
    "lr_scale": gone("learning-rate scaling by batch size is not applied: put the scaled value in "
                     "lr_scheduler.learning_rate", False),
    "lr_scale_factor": gone("learning-rate scaling by batch size is not applied", gate="lr_scale"),
    "eval_callbacks": gone("mf's evaluation runs no callbacks", None),
    "infer_precision_sync": moot("an inference switch; training determinism is training.deterministic"),
    "micro_batch_interleave_num": gone("mf has no micro-batch interleaving (its factor is kept in "
                                       "training.global_batch_size)", 1),
}

CONTEXT: dict[str, Drop] = {
    "max_device_memory": gone("mf does not cap device memory; MindSpore's own limit applies"),
    "max_call_depth": moot("a graph-compiler recursion limit; mf sets what its compiled step needs"),
    "save_graphs": gone("compiled graphs are not saved by mf (MindSpore's environment variables still work)",
                        False, 0),
    "save_graphs_path": moot("used only with save_graphs"),
    "enable_graph_kernel": gone("graph-kernel fusion is not switched on by mf", False),
    "graph_kernel_flags": gone("graph-kernel fusion is not switched on by mf", gate="enable_graph_kernel"),
    "jit_config": gone("mf chooses the compile level of its train step itself"),
    "ascend_config": gone("Ascend tuning (precision_mode, parallel_speed_up_json_path) is not set by mf"),
    "memory_optimize_level": gone("MindSpore's memory-reuse level is left at its default", "O0"),
    "mempool_block_size": gone("the memory-pool block size is left at MindSpore's default"),
    "affinity_cpu_list": gone("CPU core binding is left to MindSpore's default", None),
    "runtime_num_threads": gone("the runtime thread count is left to MindSpore's default"),
}
CONTEXT_DEFAULT = gone("a MindSpore context setting mf does not expose")

RUNNER_CONFIG: dict[str, Drop] = {
    "sink_mode": gone("data sinking has no equivalent in the new trainer; the number of steps does not "
                      "depend on it", False),
    "sink_size": moot("the steps of one sink cycle; what counts is the total, training.steps"),
    "initial_epoch": gone("a resumed run continues from the step stored in its checkpoint", 0),
}

RUNNER_WRAPPER: dict[str, Drop] = {
    "type": moot("mf's train step is built in (gradient clipping, accumulation, skipping non-finite steps)"),
}

PARALLEL: dict[str, Drop] = {
    "gradients_mean": moot("how gradients are reduced follows parallelism.disable_gradient_division and the "
                           "global batch"),
    "enable_alltoall": moot("all-to-all is used automatically when parallelism.expert_parallel > 1"),
    "full_batch": moot("mf's loader hands each data-parallel rank its own slice of the global batch"),
    "dataset_strategy": moot("mf's loader hands each data-parallel rank its own slice of the global batch"),
    "search_mode": moot("only used by the automatic strategy search, which mf does not have"),
    "strategy_ckpt_save_file": moot(_NO_STRATEGY),
    "strategy_ckpt_load_file": moot(_NO_STRATEGY),
    "strategy_ckpt_config": moot(_NO_STRATEGY),
    "loss_repeated_mean": moot("mf averages the loss over the global batch"),
}
PARALLEL_OPTIMIZER_CONFIG: dict[str, Drop] = {
    "gradient_accumulation_shard": moot("accumulated gradients are sharded as FSDP shards them "
                                        "(parallelism.data_parallel_shard_strategy)"),
    "parallel_optimizer_threshold": moot("FSDP shards every parameter, however small"),
}

PARALLEL_CONFIG: dict[str, Drop] = {
    "vocab_emb_dp": moot("with tensor_parallel > 1 mf splits the embedding over the vocabulary; the result is the "
                         "same"),
    "gradient_aggregation_group": moot("communication fusion groups are not configurable in mf"),
    "mem_coeff": moot("only used by the automatic strategy search, which mf does not have"),
    "optimizer_shard": moot("a deprecated switch; parallel.enable_parallel_optimizer is what counted"),
    "seq_split_num": gone("sequence pipelining (Seq-Pipe) is not supported", 1, None),
}

RECOMPUTE: dict[str, Drop] = {
    "parallel_optimizer_comm_recompute": gone("FSDP's parameter all-gathers are not recomputed on their own "
                                              "(recompute_comm covers communication inside the layers)", False),
    "mp_comm_recompute": gone("mf has no switch for tensor-parallel communication alone (recompute_comm selects "
                              "communication modules by name)", False),
    "recompute_slice_activation": gone("mf does not slice the activations it keeps", False),
    "select_recompute_exclude": gone("mf selects modules to recompute; it has no exclusion list", False, None),
    "select_comm_recompute_exclude": gone("mf selects modules to recompute; it has no exclusion list", False, None),
}

SWAP: dict[str, Drop] = {}

DATASET: dict[str, Drop] = {
    "construct_args_key": moot("mf passes sample columns to the model by name"),
    "output_columns": moot("mf passes sample columns to the model by name"),
    "column_order": moot("mf passes sample columns to the model by name"),
    "transforms": gone("dataset transforms are not supported: preprocess the corpus with `mf-data preprocess`"),
    "tokenizer": gone("tokenisation happens when the corpus is preprocessed (`mf-data preprocess`), not while "
                      "training"),
}

TRAINER_TYPES = ("CausalLanguageModelingTrainer", "GeneralTaskTrainer")

CALLBACKS: dict[str, Drop] = {
    "ObsMonitor": gone("uploading to AICC/OBS is not part of mf: copy output_dir yourself"),
    "SummaryMonitor": moot("mf writes TensorBoard events when monitor.tensorboard is on (the default)"),
    "ProfileMonitor": moot("profiling is the profiler section"),
    "EvalCallBack": moot("periodic evaluation is eval_dataset.eval_interval"),
    "TrainingStateMonitor": gone("its per-parameter monitors have no equivalent; see the monitor section"),
    "TopkBiasBalanceCallback": gone("mf has no auxiliary-loss-free router-bias update during training"),
    "StressDetectCallBack": gone("hardware stress detection is not part of mf"),
    "MaxLogitsMonitor": gone("a max-logit monitor is not part of mf"),
}
CALLBACK_DEFAULT = gone("a MindFormers callback with no equivalent in mf")

PROFILE: dict[str, Drop] = {
    "init_start_profile": moot("mf starts profiling at profiler.start_step"),
    "profile_communication": gone("mf's profiler has no separate communication switch (profiler_level >= 1 "
                                  "records communication)", False),
    "profile_pipeline": gone("choose the profiled ranks with profiler.profiler_rank", False),
    "data_simplification": moot("mf keeps the profiler's output as written"),
}
