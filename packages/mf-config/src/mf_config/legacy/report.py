"""What a migration returns: the new mapping and one report line per old key worth a word.

Kinds of line, in the order a user should read them:
- `action`     the user must do something before training (a value mf cannot derive, data to convert);
- `dropped`    a setting mf cannot honour: its behaviour is lost or changed;
- `translated` carried over under a rule that is not a plain copy (a rename, a move, a derivation);
- `unneeded`   not carried, but nothing is lost: the value means "off", or it is what mf does anyway.
Keys copied verbatim to the same place (`context.mode`) get no line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["action", "dropped", "translated", "unneeded"]
KINDS: tuple[Kind, ...] = ("action", "dropped", "translated", "unneeded")


@dataclass(frozen=True)
class ReportLine:
    """One line of the migration report: `key` is the old key path (`runner_config.sink_mode`), or
    a new one for the problems mf's preflight found in the migrated file. `fix`, on an action, is
    the new key whose value resolves it (`--set FIX=...` on `mf config migrate` removes the line)."""

    key: str
    kind: Kind
    message: str
    fix: str | None = None

    def __str__(self) -> str:
        return f"{self.key}: {self.kind} — {self.message}"


@dataclass
class MigrationResult:
    """`new`: the new-format mapping (plain data, sections in the reference's order);
    `report`: every old key that was not copied verbatim, with what happened to it;
    `source`: where the old config came from (a file name, or "config" for a mapping)."""

    new: dict[str, Any]
    report: list[ReportLine] = field(default_factory=list)
    source: str = "config"
    world_size: int = 1          # the devices of the old layout: `mf launch -n world_size` runs it
    overrides: list[str] = field(default_factory=list)

    def lines(self, kind: Kind) -> list[ReportLine]:
        return [line for line in self.report if line.kind == kind]

    def counts(self) -> dict[str, int]:
        return {kind: len(self.lines(kind)) for kind in KINDS}

    def summary(self) -> str:
        """`12 translated, 20 dropped, 15 unneeded, 2 need action`."""
        c = self.counts()
        return (f"{c['translated']} translated, {c['dropped']} dropped, {c['unneeded']} unneeded, "
                f"{c['action']} need action")

    def sorted_report(self) -> list[ReportLine]:
        """The report grouped by kind (actions first), each group in the old file's order."""
        return [line for kind in KINDS for line in self.lines(kind)]

    def apply_overrides(self, overrides: list[str]) -> list[ReportLine]:
        """Apply `KEY=VALUE` overrides (as `--set` does) to the new mapping; the action lines whose
        `fix` key they set are resolved and removed (returned). ConfigError for a malformed one."""
        from mf_config.overrides import apply_overrides, parse_key

        apply_overrides(self.new, overrides)
        keys = []
        for item in overrides:
            key = item.split("=", 1)[0].strip()
            keys.append(".".join(str(p) for p in parse_key(key, "--set")))
        self.overrides.extend(overrides)

        def resolved(line: ReportLine) -> bool:
            return line.kind == "action" and line.fix is not None and any(
                k == line.fix or k.startswith(line.fix + ".") or line.fix.startswith(k + ".") for k in keys)

        gone = [line for line in self.report if resolved(line)]
        self.report = [line for line in self.report if not resolved(line)]
        return gone

    def add_action(self, key: str, message: str) -> None:
        """An action found after the migration (mf's preflight on the migrated file), unless an action
        line already names `key`."""
        if any(line.kind == "action" and (line.fix == key or line.key == key or key in line.message)
               for line in self.report):
            return
        self.report.append(ReportLine(key, "action", message, fix=key))

    def validate(self):
        """The new mapping loaded as a `TrainConfig` (raises `ConfigError` if it does not validate)."""
        from mf_config.loader import load_config

        return load_config(self.new, overrides=self.prompt_placeholder())

    def prompt_placeholder(self) -> list[str]:
        """MindFormers' predict configs hold no prompts (they came on the command line, as they do
        for `mf generate CONFIG --prompt TEXT`; `mf serve` takes them from requests): a predict
        config without any is checked with a placeholder prompt, as `mf serve` checks it."""
        inf = self.new.get("inference") or {}
        if self.new.get("run_mode") == "predict" and inf.get("prompts") is None and inf.get("input_file") is None:
            return ['inference.prompts=["-"]']
        return []

    def to_yaml(self) -> str:
        """The new mapping as YAML in mf's dialect (round-trips through `load_config`), under a short
        header naming the source."""
        from mf_config.yaml_io import dump_yaml

        header = (f"# Migrated from the older MindFormers format ({self.source}) by `mf config migrate`.\n"
                  f"# Report: {self.summary()}; rerun the command to see it.\n")
        if self.overrides:
            header += f"# With --set {' --set '.join(self.overrides)}\n"
        for line in self.lines("action"):
            header += f"# action: {' '.join(str(line).split())}\n"
        return header + dump_yaml(self.new)
