"""`TrainConfig`: the whole training YAML as one typed object.

Field order is the order `dump_config` writes: the two top-level scalars, `context`, the
reference's thirteen sections in the reference's order, then the extensions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mf_config.extensions import EvalDatasetConfig, InferenceConfig, LoraConfig, TokenizerConfig
from mf_config.schema import Section, fld, non_empty
from mf_config.sections import (
    CallbackConfig,
    CheckpointConfig,
    ContextConfig,
    LrSchedulerConfig,
    ModelConfig,
    MonitorConfig,
    OptimizerConfig,
    ParallelismConfig,
    ProfilerConfig,
    RecomputeCommConfig,
    RecomputeConfig,
    SwapConfig,
    TrainDatasetConfig,
    TrainingConfig,
)

RunMode = Literal["train", "finetune", "eval", "predict"]


@dataclass(kw_only=True)
class TrainConfig(Section):
    """Every top-level section of the YAML; omitted sections take their defaults."""

    run_mode: RunMode = fld("train", doc="extension: train, finetune, eval or predict")
    output_dir: str = fld("./output", check=non_empty,
                          doc="extension: logs, metrics.jsonl, TensorBoard; default checkpoint parent")
    context: ContextConfig = fld(ContextConfig())
    checkpoint: CheckpointConfig = fld(CheckpointConfig())
    training: TrainingConfig = fld(TrainingConfig())
    parallelism: ParallelismConfig = fld(ParallelismConfig())
    optimizer: OptimizerConfig = fld(OptimizerConfig())
    lr_scheduler: LrSchedulerConfig = fld(LrSchedulerConfig())
    train_dataset: TrainDatasetConfig = fld(TrainDatasetConfig())
    model: ModelConfig = fld(ModelConfig())
    monitor: MonitorConfig = fld(MonitorConfig())
    profiler: ProfilerConfig = fld(ProfilerConfig())
    recompute: RecomputeConfig = fld(RecomputeConfig())
    recompute_comm: RecomputeCommConfig = fld(RecomputeCommConfig())
    swap: SwapConfig = fld(SwapConfig())
    callbacks: list[CallbackConfig] = fld([])
    eval_dataset: EvalDatasetConfig | None = fld(None, doc="extension: evaluation data; null = none")
    tokenizer: TokenizerConfig = fld(TokenizerConfig(), doc="extension")
    lora: LoraConfig | None = fld(None, doc="extension: LoRA adapters; null = none")
    inference: InferenceConfig = fld(InferenceConfig(), doc="extension: generation settings")

    @property
    def num_hidden_layers(self) -> int | None:
        """`model.num_hidden_layers` when the YAML declares it."""
        return self.model.num_hidden_layers


# Sections that must appear in the YAML for a run mode (the reference: model, train_dataset and
# training for training; mf's other modes need their own inputs instead).
# A fine-tune may omit `model`: it is then the model its base (checkpoint.load_path) records.
REQUIRED_SECTIONS: dict[str, tuple[str, ...]] = {
    "train": ("model", "train_dataset", "training"),
    "finetune": ("train_dataset", "training"),
    "eval": ("model", "eval_dataset"),
    "predict": ("model",),
}
