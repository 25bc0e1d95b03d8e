"""The built-in logging callback: console line, `metrics.jsonl`, TensorBoard events.

`<output_dir>/metrics.jsonl` holds one JSON object per line, every one with `step` and `time`
(wall clock, Unix seconds), of four kinds told apart by their keys:

  start       `{"step": k, "start": t, "time": t}`: a session of the run began at step k (0 for a
              new run, the checkpoint's step for a resume), so wall time adds up over sessions
  training    `loss`, `lr`, `grad_norm`, `step_time_s`, `tokens_per_s`, `mfu`, `rss_bytes`,
              `consumed_samples`, `skipped`, `skipped_steps`, ..., `comm_bytes`,
              `comm_issued_bytes`, `comm_calls` and `comm` (the step's collectives by kind, from
              mf-parallel's counter; zero in one process, where the console line leaves them out)
  evaluation  `eval_loss`, `eval_ppl`, `eval_accuracy`, `eval_tokens`, `eval_batches`,
              `eval_time_s` (`step` = the training step just finished)
  checkpoint  `{"step": N, "checkpoint": path, "time": t}` once checkpoint N is committed

`monitor.train_state.local_norm` adds `grad_norm/<parameter>` (each matching parameter's whole
gradient norm, mf_trainer/param_norms.py); TensorBoard gets `train/grad_norm/<parameter>`.
MoE models add `moe/...` routing metrics to the training records (mf_trainer/moe.py); TensorBoard
gets them under the same names (tokens per expert as a histogram). Models trained with multi-token
prediction add `mtp/loss` and `mtp/loss_k` (mf_trainer/mtp.py; TensorBoard `train/mtp/...`).

Every `monitor.log_interval` steps (and on the first and last) one console line shows progress,
loss, LR, grad norm, throughput, MFU, memory and the ETA; the first step's time excludes the
compile (the Trainer compiles the step before timing it) and the later ETAs leave that first step
out. With `monitor.tensorboard` the scalars go to `<output_dir>/tensorboard` through tensorboardX
(`train/*`, `eval/*`), with the run's hyperparameters (the HParams tab) at each session start.

On resume from step k the records of steps > k (written by the interrupted session after its
last checkpoint) are dropped, and TensorBoard gets a purge at step k + 1 (readers drop the
interrupted session's later events), so both describe one history without repeated steps.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path

from mf_trainer.callbacks import Callback
from mf_trainer.moe import write_tensorboard as write_moe_tensorboard
from mf_trainer.mtp import write_tensorboard as write_mtp_tensorboard
from mf_trainer.param_norms import PREFIX as PARAM_NORM_PREFIX
from mf_trainer.summary import RunHistory

log = logging.getLogger("mf_trainer")

SCALARS = ("loss", "lr", "grad_norm", "step_time_s", "tokens_per_s", "mfu", "rss_bytes", "comm_bytes")
EVAL_SCALARS = ("loss", "ppl", "accuracy")


def _fmt_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def _json_safe(value):
    # json has no NaN/Infinity in strict mode; keep the file parseable by any reader.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def read_records(path: Path) -> list[dict]:
    """Every whole JSON object record of a metrics file (a torn last line left out)."""
    records = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict) and isinstance(record.get("step"), int):
                    records.append(record)
    except OSError:
        pass
    return records


def truncate_metrics(path: Path, last_step: int) -> list[dict]:
    """Keep only the records of steps <= last_step (atomic rewrite); returns them."""
    if not path.exists():
        return []
    kept = [r for r in read_records(path) if r["step"] <= last_step]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    os.replace(tmp, path)
    return kept


class MetricsLogger(Callback):
    """Always-on: writes every step's metrics; prints a line every `log_interval` steps.
    `hparams`: the run's hyperparameters for TensorBoard (flat name -> scalar)."""

    def __init__(self, output_dir: str | os.PathLike, log_interval: int = 1, tensorboard: bool = True,
                 hparams: dict | None = None):
        self.output_dir = Path(output_dir)
        self.log_interval = int(log_interval)
        self.tensorboard = bool(tensorboard)
        self.hparams = dict(hparams or {})
        self.path = self.output_dir / "metrics.jsonl"
        self._file = None
        self._writer = None
        self._times: list[float] = []
        self.history = RunHistory()      # the run's whole kept history (every session), for summary.json

    def on_train_begin(self, trainer):
        self.output_dir.mkdir(parents=True, exist_ok=True)
        start = trainer.state.step
        self.history = RunHistory()
        for record in truncate_metrics(self.path, start) if start > 0 else []:
            self.history.add(record)
        self._file = open(self.path, "a" if start > 0 else "w")
        # The session began when the Trainer was built (data, model, restore), not at its first step.
        began = getattr(trainer, "started", None) or time.time()
        self._write({"step": start, "start": began, "time": time.time()})
        if self.tensorboard:
            from tensorboardX import SummaryWriter

            self._writer = SummaryWriter(logdir=str(self.output_dir / "tensorboard"), purge_step=start + 1 if start else None)
            if self.hparams:
                self._add_hparams()

    def _add_hparams(self) -> None:
        # Into this run's own events file (SummaryWriter.add_hparams would open a new run
        # directory per call): the HParams tab then shows this run with its train/ and eval/ curves.
        from tensorboardX.summary import hparams

        experiment, start_info, _ = hparams(self.hparams, {"train/loss": 0.0, "eval/loss": 0.0})
        self._writer.file_writer.add_summary(experiment)
        self._writer.file_writer.add_summary(start_info)

    def _write(self, record: dict) -> None:
        record = {**record, "time": record.get("time", time.time())}
        self._file.write(json.dumps({k: _json_safe(v) for k, v in record.items()}) + "\n")
        self._file.flush()
        self.history.add(record)

    def on_step_end(self, trainer, metrics):
        self._write(metrics)
        step = metrics["step"]
        if self._writer is not None:
            for key in SCALARS:
                value = metrics.get(key)
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self._writer.add_scalar(f"train/{key}", value, step)
            for key, value in metrics.items():      # monitor.train_state.local_norm: grad_norm/<param>
                if key.startswith(PARAM_NORM_PREFIX) and isinstance(value, float) and math.isfinite(value):
                    self._writer.add_scalar(f"train/{key}", value, step)
            write_moe_tensorboard(self._writer, metrics, step)
            write_mtp_tensorboard(self._writer, metrics, step)
        # The first step of a session runs a freshly compiled graph (allocations, first kernel
        # launches): later ETAs leave it out.
        if step > trainer.state.start_step + 1:
            self._times.append(metrics["step_time_s"])
            self._times = self._times[-50:]
        total = trainer.state.total_steps
        if step % self.log_interval == 0 or step == total or step == trainer.state.start_step + 1:
            log.info(self.line(metrics, total))
            if self._writer is not None:
                self._writer.flush()     # TensorBoard as current as the console

    def on_evaluate(self, trainer, metrics):
        self._write(metrics)
        if self._writer is not None:
            for key in EVAL_SCALARS:
                value = metrics.get(f"eval_{key}")
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self._writer.add_scalar(f"eval/{key}", value, metrics["step"])
        log.info(eval_line(metrics))

    def on_save(self, trainer, step, path):
        if self._file is not None:     # a save outside train() (Trainer.save_checkpoint from Python) has no file
            # Absolute: `mf report` may read the run from another directory than the one it ran in.
            self._write({"step": step, "checkpoint": os.path.abspath(str(path))})
        if self._writer is not None:
            # tensorboardX queues events for a writer thread and flushes every 2 minutes: a run killed
            # after this checkpoint must still hold every event up to it (a resume purges only the
            # steps after it), so let the thread drain the queue (bounded), then flush the file.
            self._drain_tensorboard()

    def _drain_tensorboard(self, timeout: float = 5.0) -> None:
        queue = getattr(getattr(self._writer.file_writer, "event_writer", None), "_event_queue", None)
        deadline = time.monotonic() + timeout
        while queue is not None and not queue.empty() and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.01)     # the event the thread took last: written before the flush
        self._writer.flush()

    def line(self, m: dict, total: int) -> str:
        step = m["step"]
        avg = sum(self._times) / len(self._times) if self._times else m["step_time_s"]
        eta = avg * max(0, total - step)
        parts = [f"step {step}/{total} ({100.0 * step / total:.1f}%)"]
        parts.append(f"loss {m['loss']:.4f}" if m.get("loss") is not None else "loss -")
        if m.get("skipped"):
            parts.append("SKIPPED (non-finite)")
        parts += [f"lr {m['lr']:.3e}", f"grad_norm {m['grad_norm']:.3f}",
                  f"{m['tokens_per_s']:.0f} tok/s", f"{m['step_time_s']:.3f} s/step"]
        if m.get("mfu") is not None:
            parts.append(f"MFU {100.0 * m['mfu']:.1f}%")
        parts.append(f"rss {m['rss_bytes'] / 2**30:.2f} GiB")
        if m.get("mtp/loss") is not None:   # multi-token prediction: its weighted part of `loss`
            parts.append(f"mtp {m['mtp/loss']:.4f}")
        if m.get("moe/max_imbalance") is not None:   # MoE models: the worst layer's max/mean expert load
            parts.append(f"moe imbalance {m['moe/max_imbalance']:.2f}")
        if m.get("comm_calls"):   # this rank's collectives in the step (one process has none)
            parts.append(f"comm {m['comm_bytes'] / 1e6:.2f} MB in {m['comm_calls']} calls")
        parts.append(f"ETA {_fmt_duration(eta)}")
        return " | ".join(parts)

    def on_train_end(self, trainer):
        self.close()

    def close(self):
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def eval_line(m: dict) -> str:
    """`eval at step 20: loss 3.2100 | ppl 24.78 | accuracy 31.20% | 4096 tokens in 8 batches | 0.41 s`."""
    head = f"eval at step {m['step']}" if m.get("step") is not None else "eval"
    compiled = f" (+ {m['eval_compile_s']:.1f} s compiling)" if m.get("eval_compile_s") else ""
    return (f"{head}: loss {m['eval_loss']:.4f} | ppl {m['eval_ppl']:.4g} | accuracy {100.0 * m['eval_accuracy']:.2f}% | "
            f"{m['eval_tokens']} tokens in {m['eval_batches']} batches | {m['eval_time_s']:.2f} s{compiled}")
