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
    """One line of the migration report: `key` is the old key path (`runner_config.sink_mode`)."""

    key: str
    kind: Kind
    message: str

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

    def validate(self):
        """The new mapping loaded as a `TrainConfig` (raises `ConfigError` if it does not validate)."""
        from mf_config.loader import load_config

        return load_config(self.new)

    def to_yaml(self) -> str:
        """The new mapping as YAML in mf's dialect (round-trips through `load_config`), under a short
        header naming the source."""
        from mf_config.yaml_io import dump_yaml

        header = (f"# Migrated from the older MindFormers format ({self.source}) by `mf config migrate`.\n"
                  f"# Report: {self.summary()}; rerun the command to see it.\n")
        return header + dump_yaml(self.new)
