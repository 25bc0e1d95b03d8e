"""What every sub-command shares for bad input: loading the YAML and reporting the preflight.

`mf config validate`, `mf train [--dry-run]`, `mf launch`, `mf eval`, `mf generate` and `mf serve`
all ask mf_trainer.preflight the same question, so they can never disagree about a config.
"""

from __future__ import annotations

from mf_cli.errors import UsageError


def load_config(path: str, overrides=()):
    """The validated YAML, or a UsageError with mf-config's one line (no MindSpore)."""
    import mf_config

    try:
        return mf_config.load_config(path, overrides=list(overrides))
    except mf_config.ConfigError as exc:
        raise UsageError(str(exc)) from None


def bad_input_message(exc: BaseException) -> str:
    """A preflight refusal keeps every problem line; any other bad input its first line."""
    import mf_trainer

    text = str(exc).strip()
    if isinstance(exc, mf_trainer.PreflightError):
        return text
    return text.splitlines()[0] if text else type(exc).__name__


def completed(cfg, notes: list | None = None):
    """The config as the run will see it: a fine-tune without a `model` section gets its base's
    (mf_trainer.sources; no MindSpore). The note saying so is appended to `notes` when given."""
    from mf_trainer.sources import complete_model_section

    cfg, note = complete_model_section(cfg)
    if note and notes is not None:
        notes.append(note)
    return cfg


def check(cfg, command: str, world: int | None = None, device: str | None = None, source: str | None = None, *,
          files: bool = True, overwrite: bool = False, plan_only: bool = False, unused: tuple[str, ...] = ()):
    """Run the preflight; every problem becomes one line of a UsageError (exit 2). Returns the report.
    `unused`: top-level sections this run does not use, whose problems are not its own."""
    import mf_trainer

    report = mf_trainer.preflight(cfg, command, world, device, source=source, files=files, overwrite=overwrite,
                                  plan_only=plan_only)
    report.problems = [p for p in report.problems if p[0].split(".")[0] not in unused]
    if report.problems:
        raise UsageError("\n".join(report.lines()))
    return report
