"""`migrate_legacy`: an older MindFormers `run_xxx.yaml` -> the new training YAML, with a report.

The rules run in dependency order (the model first: the layer count feeds the pipeline placement,
which feeds recompute; the parallel degrees feed the batch sizes, which feed the step count). Each
rule marks the old keys it dealt with; whatever is left unmarked at the end is reported as
dropped, so no key of the old file goes unmentioned. The function is pure: it reads a mapping (or
a file) and returns data; nothing is written.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from typing import Any

from mf_config.config import TrainConfig
from mf_config.errors import ConfigError, type_name
from mf_config.legacy.dataset_rules import migrate_datasets
from mf_config.legacy.memory_rules import migrate_memory
from mf_config.legacy.model_rules import migrate_model
from mf_config.legacy.optim_rules import migrate_lr_schedule, migrate_optimizer
from mf_config.legacy.parallel_rules import migrate_parallel
from mf_config.legacy.predict_rules import is_predict, migrate_predict, predict_sections
from mf_config.legacy.report import MigrationResult
from mf_config.legacy.run_rules import migrate_run
from mf_config.legacy.session import Migration
from mf_config.legacy.source import LegacySource
from mf_config.schema import declared_fields
from mf_config.yaml_io import check_aliases, read_yaml

# Top-level keys only the older format has; and sections only the new one has.
LEGACY_MARKERS = ("runner_config", "runner_wrapper", "parallel_config", "recompute_config", "moe_config",
                  "lr_schedule", "train_dataset_task", "eval_dataset_task", "trainer", "use_parallel", "processor",
                  "load_checkpoint", "auto_trans_ckpt", "resume_training", "swap_config", "monitor_config")
NEW_MARKERS = ("training", "parallelism", "lr_scheduler", "recompute", "recompute_comm", "swap", "monitor",
               "profiler", "checkpoint", "tokenizer", "lora", "inference")
_NEW_ORDER = [f.name for f in declared_fields(TrainConfig)]
_RULES = (migrate_model, migrate_parallel, migrate_memory, migrate_datasets, migrate_optimizer, migrate_lr_schedule,
          migrate_run)
# A predict config: the model, weights, tokenizer and generation settings; the training sections
# are reported as unneeded before migrate_run could translate their keys.
_PREDICT_RULES = (migrate_model, predict_sections, migrate_run, migrate_predict)


def _legacy_markers(raw: dict) -> list[str]:
    found = [k for k in LEGACY_MARKERS if k in raw]
    if isinstance(raw.get("model"), dict) and "model_config" in raw["model"]:
        found.append("model.model_config")
    if isinstance(raw.get("train_dataset"), dict) and "data_loader" in raw["train_dataset"]:
        found.append("train_dataset.data_loader")
    return found


def _check_format(raw: Any, source: str) -> None:
    if not isinstance(raw, dict):
        raise ConfigError(source, f"not an older MindFormers run_xxx.yaml: the top level must be a mapping, got "
                                  f"{type_name(raw)}")
    old = _legacy_markers(raw)
    new = [k for k in NEW_MARKERS if k in raw]
    if old and new:
        raise ConfigError(source, f"mixes the older format ({', '.join(old[:3])}) with sections of the new one "
                                  f"({', '.join(new[:3])}); migrate the old file, then merge by hand")
    if not old:
        if new:
            raise ConfigError(source, f"already in the new format (it has {', '.join(new[:3])}); check it with "
                                      "`mf config validate`")
        raise ConfigError(source, "not an older MindFormers run_xxx.yaml: none of runner_config, parallel_config, "
                                  "model.model_config, lr_schedule, train_dataset.data_loader, ... is present")


def migrate_legacy(path_or_mapping: str | os.PathLike | Mapping[str, Any]) -> MigrationResult:
    """Translate an older MindFormers run_xxx.yaml (a file path or a parsed mapping, not modified)
    into the new format. Returns the new mapping and the report; raises `ConfigError` (one line)
    when the input cannot be read or is not an old-format training config. The new mapping is not
    validated here: `result.validate()` loads it with `load_config`."""
    if isinstance(path_or_mapping, Mapping):
        raw, source = copy.deepcopy(dict(path_or_mapping)), "config"
    elif isinstance(path_or_mapping, (str, os.PathLike)):
        source = os.fspath(path_or_mapping)
        raw = read_yaml(source)
        check_aliases(raw, source)      # the rules walk the whole file: no self-reference, no alias bomb
    else:
        raise TypeError(f"migrate_legacy takes a file path or a mapping, not {type(path_or_mapping).__name__}")
    _check_format(raw, source)
    m = Migration(LegacySource(raw))
    if not isinstance(raw.get("model"), dict):
        m.action(("model",), "the old file has no model section: write model.model_type and its hyper-parameters")
    predict = is_predict(m)
    if not isinstance(raw.get("train_dataset"), dict) and raw.get("run_mode", "train") not in ("eval", "predict"):
        m.action(("train_dataset",), "the old file has no train_dataset: write train_dataset.dataloader by hand",
                 fix="train_dataset")
    for rule in _PREDICT_RULES if predict else _RULES:
        rule(m)
    for path in m.src.unhandled():
        m.dropped(path, "not a key of the older format that mf knows how to carry over")
    f = m.facts
    cp = m.get_new("parallelism.context_parallel", 1)
    world = f.data_parallel * f.tensor_parallel * f.pipeline_parallel * (cp if isinstance(cp, int) else 1)
    return MigrationResult(new=_ordered(m.new), report=m.report, source=source, world_size=1 if predict else world)


def _ordered(new: dict[str, Any]) -> dict[str, Any]:
    """Sections in the order `dump_config` writes them, empty ones left out (but `model` and
    `training`, which every training config needs, are always there)."""
    return {name: new.get(name, {}) for name in _NEW_ORDER
            if new.get(name) not in (None, {}) or name in ("model", "training")}
