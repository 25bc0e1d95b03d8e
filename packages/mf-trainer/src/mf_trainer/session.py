"""One session of a run, as its run directory sees it: what the console says first, what is
written before the first step and after the last, and whether the run may exit 0.

    session = RunSession(cfg, run_directory, writer=rank == 0)   # starts buffering train.log
    session.announce(notes)        # the first console lines: where everything goes, resume or not
    session.begin(trainer)         # --overwrite removals, config.yaml, train.log opened
    reason = session.verdict(...)  # a failed run despite finishing its steps, or None
    session.end(...)               # summary.json, train.log closed

The run directory (output_dir) ends up holding:

    config.yaml      the resolved config (mf-config's dump: defaults filled in; `mf train` loads it
                     and, being the same run, resumes or reports it finished)
    train.log        the console lines, timestamped, every session appended (runlog.py)
    metrics.jsonl    training / evaluation / checkpoint / session records (monitor.py)
    tensorboard/     scalars and the hyperparameters
    summary.json     written when a session ends (summary.py)
    checkpoint/      the default checkpoint.save_path

A run that finished its steps still fails (exit 1 from `mf train`) when more than
`training.max_skipped_fraction` of its steps were skipped as non-finite, or when its final loss
is not finite; the reason names the common cause when it applies (fp16 parameters on CPU).
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

from mf_trainer.rundir import RunDirectory, remove_outputs
from mf_trainer.runlog import RunLog

log = logging.getLogger("mf_trainer")


def outputs(cfg) -> dict[str, str]:
    """Where a run writes, by what (the console's first lines and the dry run's)."""
    out = {"output_dir": f"{cfg.output_dir} (the resolved config.yaml; summary.json at the end)",
           "metrics": os.path.join(cfg.output_dir, "metrics.jsonl")}
    if cfg.monitor.tensorboard:
        out["tensorboard"] = os.path.join(cfg.output_dir, "tensorboard")
    out["log"] = os.path.join(cfg.output_dir, "train.log")
    ckpt = cfg.checkpoint
    out["checkpoints"] = (f"{ckpt.save_path} (every {ckpt.save_interleaved_steps} steps and at the end, "
                          f"{ckpt.save_max} kept)" if ckpt.enable_save else "none (checkpoint.enable_save: false)")
    if cfg.profiler.enable_profiling:
        out["profile"] = cfg.profiler.output_path or os.path.join(cfg.output_dir, "profile")
    return out


def hparams(cfg) -> dict[str, bool | int | float | str]:
    """The run's hyperparameters for TensorBoard: every scalar of the sections that define it
    (flattened `section.key`; lists as text)."""
    from mf_config import config_to_dict

    data = config_to_dict(cfg)
    flat: dict[str, bool | int | float | str] = {"run_mode": cfg.run_mode}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}", item)
        elif isinstance(value, (bool, int, float, str)):
            flat[prefix] = value
        elif isinstance(value, list) and all(isinstance(v, (bool, int, float, str)) for v in value):
            flat[prefix] = str(value)

    for section in ("training", "optimizer", "lr_scheduler", "model", "parallelism", "lora"):
        if data.get(section) is not None:
            walk(section, data[section])
    return flat


def fp16_hint(cfg, device: str) -> str:
    """The common cause of non-finite steps, when this run has it."""
    extra = cfg.model.extra
    half = [k for k in ("params_dtype", "compute_dtype") if str(extra.get(k, "")).lower() in ("float16", "fp16")]
    if device == "CPU" and half:
        return (f"; fp16 parameters on CPU are the common cause (model.{half[0]}: float16: AdamW's small updates and "
                "eps underflow in float16, and CPU training has no loss scaling): use float32 there")
    return "; lower the learning rate, check the data, or train in float32"


class RunSession:
    """See the module docstring. `writer`: this process writes the run directory (rank 0)."""

    def __init__(self, cfg, run_directory: RunDirectory, *, writer: bool = True):
        self.cfg = cfg
        self.run_directory = run_directory
        self.writer = writer
        self.run_log = RunLog() if writer else None

    def set_writer(self, writer: bool) -> None:
        """Known once the parallel context exists: ranks other than 0 write no run directory."""
        if not writer and self.run_log is not None:
            self.run_log.close()
            self.run_log = None
        self.writer = writer

    def announce(self, notes=()) -> None:
        for what, where in outputs(self.cfg).items():
            log.info("%s: %s", what, where)
        for note in notes:
            if note:
                log.info("%s", note)
        log.info("%s", self.run_directory.describe())

    def begin(self, start_step: int, total_steps: int) -> None:
        """Before the first record of the session (rank 0): --overwrite removals, config.yaml,
        train.log."""
        if not self.writer:
            return
        from mf_config import dump_config

        state = self.run_directory
        if state.verdict == "overwrite" and state.removals:
            remove_outputs(state.removals)
            log.info("--overwrite: removed %d earlier output(s) of this run", len(state.removals))
        out = Path(self.cfg.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / f".config.yaml.{os.getpid()}.tmp"
        tmp.write_text(dump_config(self.cfg))
        os.replace(tmp, out / "config.yaml")
        how = "resumed" if start_step else "new run"
        self.run_log.open(out, f"mf train session: step {start_step} of {total_steps} ({how})")

    def verdict(self, *, step: int, skipped: int, last_loss: float | None, device: str) -> str | None:
        """Why a run that ran its steps still failed, or None."""
        fraction = self.cfg.training.max_skipped_fraction
        if step and skipped / step > fraction:
            return (f"{skipped} of {step} steps ({100.0 * skipped / step:.0f}%) were skipped as non-finite, more "
                    f"than training.max_skipped_fraction {fraction:g}" + fp16_hint(self.cfg, device))
        if last_loss is not None and not math.isfinite(last_loss):
            return f"the final loss is not finite ({last_loss} at step {step})" + fp16_hint(self.cfg, device)
        return None

    def end(self, *, status: str, reason: str | None, state, history) -> None:
        """summary.json (rank 0) and the end of train.log."""
        if not self.writer:
            return
        from mf_trainer.summary import build_summary, write_summary

        try:
            if history is not None and Path(self.cfg.output_dir).is_dir():
                summary = build_summary(history, status=status, reason=reason, step=state.step,
                                        total_steps=state.total_steps, start_step=state.start_step,
                                        consumed_samples=state.consumed_samples, output_dir=self.cfg.output_dir)
                path = write_summary(self.cfg.output_dir, summary)
                log.info("%s at step %d: summary in %s", status, state.step, path)
        finally:
            self.run_log.close()

    def close(self) -> None:
        """Stop buffering (a constructor that failed: nothing is written)."""
        if self.run_log is not None:
            self.run_log.close()
