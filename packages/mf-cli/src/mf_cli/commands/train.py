"""`mf train CONFIG [--set key=value ...] [--overwrite] [--dry-run [--world N] [--device D] [--build-model]]`: train as the YAML says.

The run directory: rerunning the same config resumes it from its last committed checkpoint (the
console says so); output_dir / checkpoint.save_path holding anything else (another config's
checkpoints, a finished run, metrics without a checkpoint) is refused with one line naming
`--set checkpoint.load_path=...` or `--overwrite`, which removes this run's own kinds of file
there first (mf_trainer.rundir lists them; never the data, checkpoint.load_path or other files).

`--dry-run` runs the preflight, resolves the layout (for `--world N` ranks, as `mf launch -n N`
would, or this process's), the accumulation and tokens per step, and where outputs would go
(output_dir, metrics, TensorBoard, checkpoints), on `--device` (default the config's); `--build-model` also builds the model and counts
its parameters (total / trainable / per rank). It writes nothing at all.

`run_mode: finetune` fine-tunes (fully, or LoRA with a `lora` section) from `checkpoint.load_path`;
`run_mode: eval | predict` are not training: exit 2 with one line naming `mf eval` / `mf generate`.

Exit status: 0 when training finished (or stopped by a callback), 2 for bad input found before
the first step (the YAML, a field this run cannot honour, missing data files, a bad model
section, an unreadable checkpoint), one line on stderr per problem and no traceback; 1 when training fails
after it started (too many non-finite steps, a failed save, a crash), with a one-line message and
the traceback written to `<output_dir>/error.log`.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback

from mf_cli.checks import bad_input_message
from mf_cli.errors import UsageError


def add_parser(subparsers, name: str, help_text: str) -> None:
    parser = subparsers.add_parser(name, help=help_text, description=help_text)
    parser.add_argument("config", help="training YAML")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key before validation (repeatable), e.g. training.steps=20")
    parser.add_argument("--dry-run", action="store_true",
                        help="check and plan only: print the layout, batch, tokens per step and outputs; write nothing")
    parser.add_argument("--world", type=int, metavar="N",
                        help="with --dry-run: plan for N ranks (what `mf launch -n N` would run) from this process")
    parser.add_argument("--device", choices=("CPU", "Ascend"),
                        help="with --dry-run: plan for this device (default: context.device_target, else this "
                             "machine's), e.g. an Ascend cluster's run checked on a laptop")
    parser.add_argument("--build-model", action="store_true",
                        help="with --dry-run: also build the model (MindSpore) and count its parameters")
    parser.add_argument("--overwrite", action="store_true",
                        help="start over: first remove what a run writes in output_dir and checkpoint.save_path "
                             "(metrics, logs, TensorBoard events, summary, checkpoints); nothing else")
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


def _is_console(handler: logging.Handler) -> bool:
    return (type(handler) is logging.StreamHandler
            and getattr(handler, "stream", None) in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__))


def _logging(stream_name: str = "stdout") -> None:
    """Progress lines of the mf loggers on stdout (`mf train`) or stderr (`mf eval`, whose stdout is the result)."""
    handler = _CurrentStream(stream_name)
    handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
    for name in ("mf_trainer", "mf_data", "mf_models", "mf_ckpt"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        for old in [h for h in logger.handlers if isinstance(h, _CurrentStream)]:
            logger.removeHandler(old)
        # A console handler of the user's (a plain StreamHandler on stdout / stderr) stays the
        # console; any other handler (a file, train.log, a test's log capture) is not a console.
        if not any(_is_console(h) for h in logger.handlers):
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


def _dry_run(args, config) -> int:
    """Preflight, layout, batch arithmetic, outputs (and parameter counts): printed, nothing written."""
    import mf_trainer

    if args.world is not None and args.world < 1:
        raise UsageError(f"--world: must be a positive integer, got {args.world}")
    if args.build_model:
        _logging()
    try:
        plan = mf_trainer.dry_run(config, world=args.world, device=args.device, build_model=args.build_model,
                                  source=args.config, overwrite=args.overwrite)
    except _bad_input_errors() as exc:
        raise UsageError(bad_input_message(exc)) from None
    for line in plan.lines():
        print(f"mf train: dry run: {line}")
    print(f"mf train: dry run: {args.config} would run {config.training.steps} steps; nothing was written")
    return 0


def run(args) -> int:
    # MindSpore's C++ logging is chatty at INFO/WARNING; the user can still ask for it.
    os.environ.setdefault("GLOG_v", "3")
    from mf_cli.checks import check, completed, load_config

    config = load_config(args.config, args.overrides)
    if not args.dry_run and (args.world is not None or args.build_model or args.device is not None):
        raise UsageError("--world, --device and --build-model go with --dry-run (a real run takes its world from the "
                         "launcher and its device from context.device_target)")
    if args.dry_run:
        return _dry_run(args, config)
    from mf_trainer.environment import world_size_from_env

    # Before MindSpore loads: a refused config answers at once (the Trainer checks again with the
    # device it resolved, and completes the config itself, saying so).
    check(completed(config), "train", world_size_from_env(), config.context.device_target, source=args.config,
          overwrite=args.overwrite)
    _logging()
    import mf_trainer

    bad_input = _bad_input_errors()
    try:
        trainer = mf_trainer.Trainer(config, overwrite=args.overwrite)
        trainer.prepare_outputs()     # output_dir and save_path written to before step 1, by every rank
    except bad_input as exc:
        raise UsageError(bad_input_message(exc)) from None
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
