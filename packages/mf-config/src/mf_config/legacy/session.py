"""`Migration`: the state one migration shares between its rules.

It holds the old config (a `LegacySource` that records which keys were dealt with), the new
mapping being built, the report, and `Facts` derived by one rule for the next (the layer count
the recompute rule needs, the data-parallel degree the batch rule needs, ...).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from mf_config.errors import fmt_value
from mf_config.legacy.report import Kind, ReportLine
from mf_config.legacy.source import LegacySource, Path, show_path
from mf_config.legacy.tables import Drop

NewPath = str | tuple[str, ...]
_UNSET: Any = object()


@dataclass
class Facts:
    family: str | None = None            # mf model_type, when the architecture is one mf has
    num_layers: int | None = None        # model.num_hidden_layers
    mtp_depth: int = 0                   # MindFormers' multi-token-prediction layers (placed after the model)
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    interleave: int = 1                  # pipeline_parallel_interleave_num
    data_parallel: int = 1
    micro_batch_num: int = 1
    stage_layers: list[list[int]] | None = None  # layer ids of every virtual stage, in virtual-stage order
    local_batch_size: int | None = None
    global_batch_size: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _split(path: NewPath) -> tuple[str, ...]:
    return tuple(path.split(".")) if isinstance(path, str) else tuple(path)


def _show_new(path: NewPath) -> str:
    return show_path(_split(path))


class Migration:
    def __init__(self, src: LegacySource):
        self.src = src
        self.new: dict[str, Any] = {}
        self.report: list[ReportLine] = []
        self.facts = Facts()

    # -- the new mapping ---------------------------------------------------------------------------
    def set(self, path: NewPath, value: Any) -> None:
        keys = _split(path)
        node = self.new
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = copy.deepcopy(value)

    def get_new(self, path: NewPath, default: Any = None) -> Any:
        node: Any = self.new
        for key in _split(path):
            if not isinstance(node, dict) or key not in node:
                return default
            node = node[key]
        return node

    # -- the report --------------------------------------------------------------------------------
    def line(self, path: Path, kind: Kind, message: str, mark: bool = True, fix: str | None = None) -> None:
        """Report `path`; `mark=False` for a summary line about a section whose keys are reported
        (or carried) one by one; `fix` (actions) the new key whose value resolves it."""
        if mark:
            self.src.mark(path)
        self.report.append(ReportLine(show_path(path), kind, message, fix))

    def translated(self, path: Path, message: str) -> None:
        self.line(path, "translated", message)

    def dropped(self, path: Path, reason: str) -> None:
        self.line(path, "dropped", reason)

    def unneeded(self, path: Path, reason: str) -> None:
        self.line(path, "unneeded", reason)

    def action(self, path: Path, message: str, fix: str | None = None) -> None:
        self.line(path, "action", message, fix=fix)

    # -- common rules ------------------------------------------------------------------------------
    def copy(self, old: Path, new: NewPath, value: Any = _UNSET, note: str = "") -> None:
        """Carry `old` to `new` (with `value` when given, else the old value). A plain copy to the same
        path is silent; any other is reported as translated, with `note` appended."""
        value = self.src.get(old) if value is _UNSET else value
        self.set(new, value)
        self.src.mark(old)
        if show_path(old) != _show_new(new) or note:
            text = f"{_show_new(new)}: {fmt_value(value)}"
            self.translated(old, f"{text}; {note}" if note else text)

    def drop(self, path: Path, spec: Drop, prefix: str = "") -> None:
        siblings = self.src.get(path[:-1]) if len(path) > 1 else self.src.data
        kind, message = spec.verdict(self.src.get(path), siblings if isinstance(siblings, dict) else {})
        self.line(path, kind, prefix + message)

    def drop_table(self, prefix: Path, table: dict[str, Drop], default: Drop | None = None) -> None:
        """Report every not-yet-handled key of the mapping at `prefix` found in `table` (or every
        one, with `default`)."""
        for key in list(self.src.mapping(prefix)):
            path = (*prefix, key)
            if self.src.is_handled(path):
                continue
            spec = table.get(key, default)
            if spec is not None:
                self.drop(path, spec)

    def value(self, path: Path, default: Any = None) -> Any:
        return self.src.get(path, default)
