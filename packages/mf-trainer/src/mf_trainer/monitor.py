"""The built-in logging callback: console line, `metrics.jsonl`, TensorBoard events.

Every step appends one JSON object to `<output_dir>/metrics.jsonl` (`step`, `loss`, `lr`,
`grad_norm`, `step_time_s`, `tokens_per_s`, `mfu`, `rss_bytes`, `consumed_samples`, `skipped`,
..., `comm_bytes`, `comm_issued_bytes`, `comm_calls` and `comm`: the step's collectives by
kind, from mf-parallel's counter; zero in one process, where the console line leaves them out);
MoE models add `moe/...` routing metrics (mf_trainer/moe.py), TensorBoard gets them under the same
names (tokens per expert as a histogram). Every `monitor.log_interval` steps (and on the last step) one console line shows progress,
loss, LR, grad norm, throughput, MFU, memory and the ETA. With `monitor.tensorboard` the scalars
go to `<output_dir>/tensorboard` through tensorboardX.

Evaluations during training (`eval_dataset`) append their own records to the same file: `step`
(the training step just finished), `eval_loss`, `eval_ppl`, `eval_accuracy`, `eval_tokens`,
`eval_batches`, `eval_time_s`; TensorBoard gets `eval/loss`, `eval/ppl`, `eval/accuracy`; the
console one line. A record is a training step when it has `loss`, an evaluation when it has
`eval_loss`.

On resume from step k the lines of steps > k (written by the interrupted run after its last
checkpoint) are dropped, so the file always describes one consistent history.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

from mf_trainer.callbacks import BUILT_IN_ALWAYS_ON, Callback
from mf_trainer.moe import write_tensorboard as write_moe_tensorboard

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


def truncate_metrics(path: Path, last_step: int) -> None:
    """Keep only the lines of steps <= last_step (atomic rewrite)."""
    if not path.exists():
        return
    kept = []
    with open(path) as f:
        for line in f:
            try:
                if int(json.loads(line)["step"]) <= last_step:
                    kept.append(line if line.endswith("\n") else line + "\n")
            except (ValueError, KeyError, TypeError):
                continue
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(kept))
    os.replace(tmp, path)


class MetricsLogger(Callback):
    """Always-on: writes every step's metrics; prints a line every `log_interval` steps."""

    def __init__(self, output_dir: str | os.PathLike, log_interval: int = 1, tensorboard: bool = True):
        self.output_dir = Path(output_dir)
        self.log_interval = int(log_interval)
        self.tensorboard = bool(tensorboard)
        self.path = self.output_dir / "metrics.jsonl"
        self._file = None
        self._writer = None
        self._times: list[float] = []

    def on_train_begin(self, trainer):
        self.output_dir.mkdir(parents=True, exist_ok=True)
        start = trainer.state.step
        if start > 0:
            truncate_metrics(self.path, start)
            self._file = open(self.path, "a")
        else:
            self._file = open(self.path, "w")
        if self.tensorboard:
            from tensorboardX import SummaryWriter

            self._writer = SummaryWriter(logdir=str(self.output_dir / "tensorboard"), purge_step=start + 1 if start else None)

    def on_step_end(self, trainer, metrics):
        self._file.write(json.dumps({k: _json_safe(v) for k, v in metrics.items()}) + "\n")
        self._file.flush()
        step = metrics["step"]
        if self._writer is not None:
            for key in SCALARS:
                value = metrics.get(key)
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self._writer.add_scalar(f"train/{key}", value, step)
            write_moe_tensorboard(self._writer, metrics, step)
        # The first step includes graph compilation: leave it out of the ETA.
        if step > trainer.state.start_step + 1:
            self._times.append(metrics["step_time_s"])
            self._times = self._times[-50:]
        total = trainer.state.total_steps
        if step % self.log_interval == 0 or step == total or step == trainer.state.start_step + 1:
            log.info(self.line(metrics, total))

    def on_evaluate(self, trainer, metrics):
        self._file.write(json.dumps({k: _json_safe(v) for k, v in metrics.items()}) + "\n")
        self._file.flush()
        if self._writer is not None:
            for key in EVAL_SCALARS:
                value = metrics.get(f"eval_{key}")
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self._writer.add_scalar(f"eval/{key}", value, metrics["step"])
        log.info(eval_line(metrics))

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
    return (f"{head}: loss {m['eval_loss']:.4f} | ppl {m['eval_ppl']:.4g} | accuracy {100.0 * m['eval_accuracy']:.2f}% | "
            f"{m['eval_tokens']} tokens in {m['eval_batches']} batches | {m['eval_time_s']:.2f} s")


BUILT_IN_ALWAYS_ON["MetricsLogger"] = "configure it with monitor.log_interval and monitor.tensorboard"
