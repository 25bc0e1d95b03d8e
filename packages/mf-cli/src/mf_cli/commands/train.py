"""`mf train CONFIG [--set key=value ...]`: train as the YAML says.

`run_mode: finetune` fine-tunes (fully, or LoRA with a `lora` section) from `checkpoint.load_path`;
`run_mode: eval | predict` are not training: exit 2 with one line naming `mf eval` / `mf generate`.

Exit status: 0 when training finished (or stopped by a callback), 2 for bad input found before
the first step (the YAML, a field this run cannot honour, missing data files, a bad model
section, an unreadable checkpoint), one line on stderr and no traceback; 1 when training fails
after it started (too many non-finite steps, a failed save, a crash), with a one-line message and
the traceback written to `<output_dir>/error.log`.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback

from mf_cli.errors import UsageError


def add_parser(subparsers, name: str, help_text: str) -> None:
    parser = subparsers.add_parser(name, help=help_text, description=help_text)
    parser.add_argument("config", help="training YAML")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key before validation (repeatable), e.g. training.steps=20")
    parser.set_defaults(run=run)


class _CurrentStream(logging.StreamHandler):
    """Writes to whatever sys.stdout / sys.stderr is when a record is emitted (a caller, or a test,
    may have replaced them since the handler was installed)."""

    def __init__(self, name: str):
        super().__init__()
        self.stream_name = name

    @property
    def stream(self):
        return getattr(sys, self.stream_name)

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ assigns it; the property decides
        pass


def _logging(stream_name: str = "stdout") -> None:
    """Progress lines of the mf loggers on stdout (`mf train`) or stderr (`mf eval`, whose stdout is the result)."""
    handler = _CurrentStream(stream_name)
    handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
    for name in ("mf_trainer", "mf_data", "mf_models", "mf_ckpt"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        for old in [h for h in logger.handlers if isinstance(h, _CurrentStream)]:
            logger.removeHandler(old)
        if not logger.handlers:
            logger.addHandler(handler)
        logger.propagate = False


def _bad_input_errors() -> tuple[type[BaseException], ...]:
    import mf_ckpt
    import mf_config
    import mf_data
    import mf_models
    import mf_trainer

    return (mf_config.ConfigError, mf_trainer.TrainerConfigError, mf_models.ModelConfigError,
            mf_models.ModelStateError, mf_data.MFDataError, mf_ckpt.CheckpointError)


def run(args) -> int:
    # MindSpore's C++ logging is chatty at INFO/WARNING; the user can still ask for it.
    os.environ.setdefault("GLOG_v", "3")
    import mf_config

    try:
        config = mf_config.load_config(args.config, overrides=args.overrides)
    except mf_config.ConfigError as exc:
        raise UsageError(str(exc)) from None
    if config.run_mode in ("eval", "predict"):  # not training: name the command that runs it
        command = "mf eval" if config.run_mode == "eval" else "mf generate"
        raise UsageError(f"run_mode: {config.run_mode!r} is not a training mode: run `{command} {args.config}`")
    _logging()
    import mf_trainer

    bad_input = _bad_input_errors()
    try:
        trainer = mf_trainer.Trainer(config)
    except bad_input as exc:
        raise UsageError(str(exc).strip().splitlines()[0]) from None
    try:
        result = trainer.train()
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # a failure after training started: exit 1, details in error.log
        # One file per rank when several ranks share the output directory.
        rank = trainer.parallel.rank if trainer.parallel.enabled else None
        log_path = os.path.join(config.output_dir, "error.log" if rank is None else f"error_rank{rank}.log")
        try:
            with open(log_path, "w") as f:
                traceback.print_exc(file=f)
            where = f" (traceback in {log_path})"
        except OSError:
            where = ""
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"mf train: training failed: {message}{where}", file=sys.stderr)
        return 1
    last = f", final loss {result.losses[-1]:.4f}" if result.losses else ""
    saved = f", checkpoint {result.checkpoint}" if result.checkpoint else ""
    print(f"mf train: done at step {result.step}{last}{saved}")
    return 0
