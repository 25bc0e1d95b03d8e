"""`mf config validate|show FILE [--set key=value ...]` and `mf config migrate OLD [-o NEW] [--force]
[--set key=value ...] [--device CPU|Ascend] [--summary] [--report FILE]`.

`migrate` translates the old file (mf-config), applies `--set` (which also resolves the action
lines naming that key), then runs the preflight of the command that will run the new file (`mf
train`, `mf launch -n N` for the old layout's N devices, `mf generate` for a predict config): every
problem it finds that no action line names yet becomes one, so a written file either passes that
preflight or lists every remaining problem (also as `# action:` comments at the top of the file).

`validate FILE [--world N] [--device CPU|Ascend] [--no-files]` runs mf-config's schema and rules,
then mf-trainer's preflight for the command that runs FILE's run_mode (the same checks `mf train`,
`mf launch`, `mf eval` and `mf generate` run): every problem is one `key: reason` line on stderr,
exit 2. Checks that need the world size or the device are listed as not checked when those are
not given; `--no-files` also skips the ones that look at this machine's files (output_dir and
save_path writable and free of another run, the datasets' token ids against the vocabulary: a
config written for another machine). It writes nothing and imports no MindSpore: a bad key is
reported in a fraction of a second.
"""

from __future__ import annotations

import os
import sys

from mf_cli.errors import UsageError


def add_parser(subparsers, name: str, help_text: str) -> None:
    parser = subparsers.add_parser(name, help=help_text, description=help_text)
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    for action, text in (("validate", "check a YAML against the schema, its rules and the preflight (every "
                                      "problem the run would refuse, one line each)"),
                         ("show", "print the resolved YAML with every default filled in")):
        p = actions.add_parser(action, help=text, description=text)
        p.add_argument("file", help="training YAML")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a key before validation (repeatable), e.g. training.steps=20")
        if action == "validate":
            p.add_argument("--world", type=int, metavar="N",
                           help="check the layout for N ranks (mf launch -n N); without it the checks that need the "
                                "world size are skipped and listed")
            p.add_argument("--device", choices=("CPU", "Ascend"),
                           help="check against this device (default: context.device_target when set)")
            p.add_argument("--no-files", action="store_true",
                           help="skip the checks that read this machine's files (outputs, the data's token ids)")
        p.set_defaults(run=run)
    text = "convert an older MindFormers run_xxx.yaml into the new format, reporting what was not carried over"
    p = actions.add_parser("migrate", help=text, description=text + ". The report goes to stderr.")
    p.add_argument("file", help="the old run_xxx.yaml")
    p.add_argument("-o", "--output", metavar="NEW", help="write the new YAML here (default: print it on stdout)")
    p.add_argument("--force", action="store_true", help="overwrite NEW (and the --report FILE) if it exists")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="set a key of the NEW file (repeatable), e.g. train_dataset.dataloader.config.data_path=[/d/x]; "
                        "the action lines it answers are removed")
    p.add_argument("--device", choices=("CPU", "Ascend"),
                   help="check the new file against this device (default: its context.device_target)")
    p.add_argument("--summary", action="store_true", help="print the counts and the action lines only, not every line")
    p.add_argument("--report", metavar="FILE", help="also write the whole report to FILE")
    p.set_defaults(run=run)


def run(args) -> int:
    import mf_config

    if args.action == "migrate":
        return _migrate(args)
    try:
        config = mf_config.load_config(args.file, overrides=args.overrides)
    except mf_config.ConfigError as exc:
        raise UsageError(str(exc)) from None
    if args.action == "show":
        sys.stdout.write(mf_config.dump_config(config))
        return 0
    return _validate(args, config)


# run_mode -> the command whose preflight `validate` runs.
_COMMAND_OF = {"train": "train", "finetune": "train", "eval": "eval", "predict": "generate"}


def _validate(args, config) -> int:
    """The preflight of the command that runs this config: `mf train` (or `mf launch` for
    --world N > 1), `mf eval`, `mf generate`. No MindSpore is imported."""
    import mf_config
    from mf_cli.checks import check, completed

    if args.world is not None and args.world < 1:
        raise UsageError(f"--world: must be a positive integer, got {args.world}")
    command = _COMMAND_OF[config.run_mode]
    if command == "train" and args.world is not None and args.world > 1:
        command = "launch"
    notes: list[str] = []
    if not args.no_files:
        config = completed(config, notes)
    report = check(config, command, args.world, args.device or config.context.device_target, source=args.file,
                   files=not args.no_files, plan_only=True)
    for note in notes:
        print(f"mf config: note: {note}", file=sys.stderr)
    for line in report.notice_lines():
        print(f"mf config: {line}", file=sys.stderr)
    for warning in mf_config.path_warnings(config):
        print(f"mf config: warning: {warning}", file=sys.stderr)
    for line in report.skipped:
        print(f"mf config: not checked: {line}", file=sys.stderr)
    print(f"{args.file}: OK" + (f" ({len(report.skipped)} checks skipped, listed on stderr)" if report.skipped else ""))
    return 0


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _check_output(path: str, force: bool, flag: str, source: str) -> None:
    """Refuse before doing any work: the old file itself (never overwritten, even with --force),
    an existing file without --force, a directory, a missing parent."""
    if _same_file(path, source):
        raise UsageError(f"{flag} {path}: is the file being migrated; write the new file elsewhere")
    if os.path.isdir(path):
        raise UsageError(f"{path}: is a directory; give a file name with {flag}")
    if os.path.lexists(path) and not force:
        raise UsageError(f"{path}: already exists; add --force to overwrite it")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(f"{path}: the directory {parent} does not exist")


def _write_atomically(path: str, text: str) -> None:
    """Whole or not at all, with the umask's permissions (mf_cli.files)."""
    from mf_cli.files import write_atomically

    try:
        write_atomically(path, text)
    except OSError as exc:
        raise UsageError(f"{path}: cannot be written ({exc.strerror or exc})") from None


def _preflight_command(result, cfg) -> tuple[str, int | None]:
    """(command, world) that will run the migrated file: a predict config `mf generate`, an eval
    config `mf eval`, a training config `mf train` or `mf launch -n N` for the old layout's N."""
    if cfg.run_mode == "predict":
        return "generate", 1
    if cfg.run_mode == "eval":
        return "eval", 1
    return ("train" if result.world_size == 1 else "launch"), result.world_size


def _run_hint(result, cfg, target: str) -> str:
    name = "NEW" if target == "stdout" else target
    if cfg.run_mode == "predict":
        return f"`mf generate {name} --prompt TEXT` or `mf serve {name}`"
    if cfg.run_mode == "eval":
        return f"`mf eval {name}`"
    return f"`mf train {name}`" if result.world_size == 1 else f"`mf launch -n {result.world_size} {name}`"


def _add_preflight_actions(result, cfg, device: str | None) -> None:
    import mf_trainer

    command, world = _preflight_command(result, cfg)
    report = mf_trainer.preflight(cfg, command, world, device)
    for key, reason in report.problems:
        result.add_action(key, f"`mf {command}` refuses it: {reason}")


def _migrate(args) -> int:
    import mf_config

    if args.output is not None:
        _check_output(args.output, args.force, "-o", args.file)
    if args.report is not None:
        _check_output(args.report, args.force, "--report", args.file)
        if args.output is not None and _same_file(args.report, args.output):
            raise UsageError(f"--report {args.report}: is also -o; give the report its own file")
    try:
        result = mf_config.migrate_legacy(args.file)
        resolved = result.apply_overrides(args.overrides)
    except mf_config.ConfigError as exc:
        raise UsageError(str(exc)) from None
    try:
        cfg = result.validate()
    except mf_config.ConfigError as exc:
        hint = "" if args.overrides else f" (give it with --set {exc.key_path}=...)"
        raise UsageError(f"{args.file}: the migrated config does not validate: {exc}{hint}") from None
    _add_preflight_actions(result, cfg, args.device or cfg.context.device_target)
    lines = [f"  {line}" for line in result.sorted_report()]
    shown = [f"  {line}" for line in result.lines("action")] if args.summary else lines
    for line in shown:
        print(line, file=sys.stderr)
    text = result.to_yaml()
    if args.output is None:
        sys.stdout.write(text)
        target = "stdout"
    else:
        _write_atomically(args.output, text)
        target = args.output
    summary = f"mf config migrate: {args.file} -> {target}: {result.summary()}"
    if resolved:
        summary += f" ({len(resolved)} answered by --set)"
    if args.report is not None:
        _write_atomically(args.report, "\n".join([summary, *lines]) + "\n")
    print(summary, file=sys.stderr)
    if result.lines("action"):
        print("mf config migrate: the 'action' lines need an edit (or --set KEY=VALUE) before it runs", file=sys.stderr)
    else:
        print(f"mf config migrate: passes the preflight; run it with {_run_hint(result, cfg, target)}", file=sys.stderr)
    return 0
