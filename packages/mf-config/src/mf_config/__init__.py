"""mf-config: the training YAML as a typed, validated `TrainConfig`.

    from mf_config import load_config, dump_config
    cfg = load_config("train.yaml", overrides=["training.steps=20"])
    cfg.training.global_batch_size, cfg.model.extra["hidden_size"], cfg.optimizer.kwargs()

Bad input raises `ConfigError`, whose message is one line naming the key path and the value.
`migrate_legacy("run_xxx.yaml")` translates an older MindFormers config into this format.
"""

from mf_config.config import REQUIRED_SECTIONS, TrainConfig
from mf_config.data_rules import split_data_path
from mf_config.errors import ConfigError
from mf_config.extensions import EvalDatasetConfig, InferenceConfig, LoraConfig, TokenizerConfig
from mf_config.layer_spec import even_layer_counts, parse_layer_spec, pipeline_chunks, pipeline_layer_placement
from mf_config.loader import config_to_dict, dump_config, load_config
from mf_config.overrides import apply_overrides
from mf_config.paths import path_warnings
from mf_config.schema import ExtraSection, Section
from mf_config.sections import (
    CallbackConfig,
    CheckpointConfig,
    ContextConfig,
    DataloaderConfig,
    LayerSwapConfig,
    LrSchedulerConfig,
    ModelConfig,
    MoeMonitorConfig,
    MonitorConfig,
    OpSwapConfig,
    OptimizerConfig,
    ParallelismConfig,
    ProfilerConfig,
    RecomputeCommConfig,
    RecomputeConfig,
    SwapConfig,
    TrainDatasetConfig,
    TrainingConfig,
    TrainStateConfig,
)

__version__ = "0.5.0"

__all__ = [
    "REQUIRED_SECTIONS",
    "CallbackConfig",
    "CheckpointConfig",
    "ConfigError",
    "ContextConfig",
    "DataloaderConfig",
    "EvalDatasetConfig",
    "ExtraSection",
    "InferenceConfig",
    "LayerSwapConfig",
    "LoraConfig",
    "LrSchedulerConfig",
    "MigrationResult",
    "ModelConfig",
    "MoeMonitorConfig",
    "MonitorConfig",
    "OpSwapConfig",
    "OptimizerConfig",
    "ParallelismConfig",
    "ProfilerConfig",
    "RecomputeCommConfig",
    "RecomputeConfig",
    "ReportLine",
    "Section",
    "SwapConfig",
    "TokenizerConfig",
    "TrainConfig",
    "TrainDatasetConfig",
    "TrainStateConfig",
    "TrainingConfig",
    "__version__",
    "apply_overrides",
    "config_to_dict",
    "dump_config",
    "load_config",
    "migrate_legacy",
    "parse_layer_spec",
    "path_warnings",
    "pipeline_layer_placement",
    "pipeline_chunks",
    "even_layer_counts",
    "split_data_path",
]


# The MindFormers migration tables are large and only `mf config migrate` needs them: loaded on
# first use, so `import mf_config` (every `mf` command, the trainer's preflight) stays cheap.
_LEGACY = ("MigrationResult", "ReportLine", "migrate_legacy")


def __getattr__(name: str):
    if name in _LEGACY:
        import mf_config.legacy as legacy

        value = getattr(legacy, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mf_config' has no attribute {name!r}")
