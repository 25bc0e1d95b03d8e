"""`mf config validate|show FILE [--set key=value ...]`."""

from __future__ import annotations

import sys

from mf_cli.errors import UsageError


def add_parser(subparsers, name: str, help_text: str) -> None:
    parser = subparsers.add_parser(name, help=help_text, description=help_text)
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    for action, text in (("validate", "check a YAML against the schema and its rules"),
                         ("show", "print the resolved YAML with every default filled in")):
        p = actions.add_parser(action, help=text, description=text)
        p.add_argument("file", help="training YAML")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a key before validation (repeatable), e.g. training.steps=20")
        p.set_defaults(run=run)


def run(args) -> int:
    import mf_config

    try:
        config = mf_config.load_config(args.file, overrides=args.overrides)
    except mf_config.ConfigError as exc:
        raise UsageError(str(exc)) from None
    if args.action == "show":
        sys.stdout.write(mf_config.dump_config(config))
        return 0
    for warning in mf_config.path_warnings(config):
        print(f"mf config: warning: {warning}", file=sys.stderr)
    print(f"{args.file}: OK")
    return 0
