"""The README documents every field of every section, with its default, and every extension."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import mf_config
from mf_config.schema import Section, declared_fields

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def _rows() -> dict[str, str]:
    """Table rows keyed by their first cell (a backticked field name)."""
    rows = {}
    for line in README.splitlines():
        match = re.match(r"\| `([^`]+)` \|", line)
        if match:
            rows.setdefault(match.group(1), line)
    return rows


def _field_names(cls: type) -> list[str]:
    """Declared fields that are not sub-sections (those have their own rows)."""
    return [f.name for f in declared_fields(cls)
            if f.default_factory is dataclasses.MISSING or not isinstance(f.default_factory(), Section)]


def test_every_field_has_a_row():
    rows = _rows()
    sections = [cls for name in mf_config.__all__
                if isinstance(cls := getattr(mf_config, name), type) and issubclass(cls, Section)
                and cls not in (Section, mf_config.ExtraSection, mf_config.TrainConfig, mf_config.MonitorConfig,
                                mf_config.TrainStateConfig, mf_config.MoeMonitorConfig, mf_config.CallbackConfig,
                                mf_config.EvalDatasetConfig)]
    missing = [f"{cls.__name__}.{name}" for cls in sections for name in _field_names(cls) if name not in rows]
    monitor = [p + f.name for p, cls in (("train_state.", mf_config.TrainStateConfig),
                                         ("moe_monitor.", mf_config.MoeMonitorConfig), ("", mf_config.MonitorConfig))
               for f in declared_fields(cls) if p or f.name not in ("train_state", "moe_monitor")]
    missing += [name for name in monitor if name not in rows]
    missing += [name for name in ("run_mode", "output_dir", "callbacks[].type", "eval_interval", "eval_iters")
                if name not in rows]
    assert missing == []


def test_rows_show_the_defaults():
    rows = _rows()
    for name, default in [("steps", "`1000`"), ("save_max", "`5`"), ("npu_nums_per_device", "`8`"),
                          ("reshard_after_forward_policy", '`"default"`'), ("with_stack", "`True`"),
                          ("lora_alpha", "`16.0`"), ("eval_iters", "`10`"), ("output_dir", '`"./output"`')]:
        assert default in rows[name], rows[name]


def test_extensions_are_marked():
    rows = _rows()
    for name in ("run_mode", "output_dir", "max_consecutive_nonfinite", "hang_timeout_s", "log_interval",
                 "tensorboard", "peak_flops_per_device"):
        assert "*extension*" in rows[name], name
    for section in ("eval_dataset", "tokenizer", "lora", "inference"):
        assert f"#### `{section}`" in README.split("## Extensions")[1]
