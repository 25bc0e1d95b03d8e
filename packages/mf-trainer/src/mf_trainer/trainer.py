"""The Trainer: one readable loop composing data, model, optimizer, schedule, step and callbacks.

    trainer = Trainer(mf_config.load_config("train.yaml"))
    result = trainer.train()

Construction does every check and every expensive preparation (device, model, optimizer, data,
checkpoint restore), so a bad YAML fails before the first step. `train()` runs
`training.steps` optimizer steps; each step draws `accumulation` micro-batches of
`local_batch_size` samples (accumulation = global_batch_size // (dp x local_batch_size)), feeds
the scheduler's LR, and hands the metrics to the callbacks (logging and checkpointing are
built in; `callbacks:` adds more).

Started on several ranks (`mf launch`, msrun), every rank runs this same loop on its share of the
work (parallel.py: layout, the model's plan, data slices, global-token loss, sharded clipping and
checkpoints); the loss, norm and decisions are global, so every rank takes the same path. Rank 0
alone writes metrics, TensorBoard, console progress and the end-of-training sample.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

import numpy as np

import mf_models
from mf_trainer import runtime
from mf_trainer.callbacks import Callback, CallbackList, build_callbacks
from mf_trainer.checkpointing import CheckpointSaver, load_checkpoint
from mf_trainer.data import build_loader, ensure_demo_corpus
from mf_trainer.errors import TrainerConfigError, TrainingError
from mf_trainer.evaluation import build_evaluator
from mf_trainer.finetune import Finetune
from mf_trainer.loss import MaskedLMLoss
from mf_trainer.lr_schedulers import build_scheduler
from mf_trainer.metrics import host_rss_bytes, peak_flops_per_device
from mf_trainer.monitor import MetricsLogger
from mf_trainer.optimizer import build_adamw
from mf_trainer.parallel import ParallelContext, ShardedState, build_dims, comm_metrics
from mf_trainer.profiling import ProfilerCallback
from mf_trainer.recompute import apply_recompute
from mf_trainer.step import GradNorm, StepRunner
from mf_trainer.support import check_supported

log = logging.getLogger("mf_trainer")


@dataclass
class TrainState:
    total_steps: int
    step: int = 0              # steps run, skipped ones included (the loop counter)
    start_step: int = 0        # where this process started (after a resume)
    consumed_samples: int = 0  # samples of the global order used so far
    skipped_steps: int = 0     # non-finite steps, never applied
    nonfinite_in_row: int = 0


@dataclass
class TrainResult:
    step: int
    losses: list[float] = field(default_factory=list)  # this process's steps, in order
    checkpoint: str | None = None                      # the last committed checkpoint
    samples: list[dict] = field(default_factory=list)  # end-of-training generations


def _accumulation(training, dp: int) -> int:
    per_micro = dp * training.local_batch_size
    if per_micro > training.global_batch_size:
        raise TrainerConfigError(
            f"training.global_batch_size: {training.global_batch_size} is below data_parallel ({dp}) x "
            f"local_batch_size ({training.local_batch_size}) = {per_micro}")
    return training.global_batch_size // per_micro


class Trainer:
    def __init__(self, config, callbacks: list[Callback] | tuple = ()):
        self.config = cfg = config
        self.should_stop = False
        self.device = runtime.resolve_device(cfg.context.device_target)
        world = runtime.world_size_from_env()
        check_supported(cfg, self.device, world)
        dims = build_dims(cfg, world, self.device)
        dp = dims.dp
        self.accumulation = _accumulation(cfg.training, dp)
        self.global_batch = self.accumulation * dp * cfg.training.local_batch_size
        if self.global_batch != cfg.training.global_batch_size:
            log.info("training.global_batch_size %d is not a multiple of dp x local_batch_size; using %d "
                     "(floor division, as specified)", cfg.training.global_batch_size, self.global_batch)
        self.output_dir = cfg.output_dir  # created by train(): a refused config writes nothing
        # Pure-Python parts first: a bad schedule or callback fails before any model is built.
        self.scheduler = build_scheduler(cfg.lr_scheduler.type, cfg.lr_scheduler.learning_rate,
                                         cfg.lr_scheduler.extra, total_steps=cfg.training.steps)
        user_callbacks = [*build_callbacks(cfg.callbacks), *callbacks]
        runtime.setup_context(self.device, cfg.context.mode, cfg.context.device_id, cfg.training.deterministic)
        self.mode = cfg.context.mode
        self.parallel = ParallelContext(cfg, dims)    # joins the world (collective) when there are ranks
        blocker = self.parallel.graph_mode_blocker()
        if blocker and self.mode == 0:
            log.warning("context.mode 0: %s (mf_parallel.graph_mode_blocker); training in PyNative", blocker)
            runtime.use_pynative()
            self.mode = 1
        runtime.seed_everything(cfg.training.seed)

        # run_mode finetune: start weights, LoRA, and resuming its own save_path (finetune.py).
        self.finetune = Finetune(cfg, cfg.training.seed) if cfg.run_mode == "finetune" else None
        self.model = self._build_model()
        self.optimizer = build_adamw([(p.name, p) for p in self.model.trainable_params()], cfg.optimizer)
        self.sharded = ShardedState(self.parallel, self.model, self.optimizer) if self.parallel.enabled else None
        self.state = TrainState(total_steps=cfg.training.steps)
        if self.finetune is not None:
            if self.finetune.resume_path:
                self._restore(self.finetune.resume_path)
        elif cfg.checkpoint.load_path:
            self._restore()
        if self.parallel.enabled and "demo_corpus" in cfg.train_dataset.dataloader.extra:
            # One builder of the demo corpus; the other ranks find it built.
            if self.parallel.is_rank0:
                ensure_demo_corpus(dict(cfg.train_dataset.dataloader.extra), cfg.tokenizer.path,
                                   cfg.model.extra.get("vocab_size"))
            self.parallel.barrier()
        self.loader = build_loader(cfg, micro_batch_size=cfg.training.local_batch_size, dp_rank=self.parallel.dp_rank,
                                   dp_size=dp, consumed_samples=self.state.consumed_samples,
                                   is_built_on_rank=(lambda: self.parallel.is_rank0) if self.parallel.enabled else None)
        self._check_data()
        if cfg.eval_dataset is not None and dims.tp_enabled:
            raise TrainerConfigError("eval_dataset: evaluation during training with tensor_parallel > 1 is not "
                                     "implemented (its loss and accuracy need the vocabulary-split logits); evaluate "
                                     "the saved checkpoint with `mf eval`")
        self.evaluator = build_evaluator(cfg, self.model, cfg.training.local_batch_size)
        self.runner = self._make_runner()

        self.seq_length = self.loader.config.sequence_length
        self.flops_per_token = self.model.num_flops_per_token(self.seq_length)
        self.peak_flops, peak_source = peak_flops_per_device(self.device, cfg.monitor.peak_flops_per_device)
        log.info("device %s, %s mode; peak %s FLOP/s (%s); %.2fM parameters; accumulation %d x %d samples",
                 self.device, "GRAPH" if self.mode == 0 else "PyNative",
                 f"{self.peak_flops:.3g}" if self.peak_flops else "unknown", peak_source,
                 sum(p.size for p in self.model.trainable_params()) / 1e6, self.accumulation,
                 cfg.training.local_batch_size)
        self.checkpointer = CheckpointSaver(cfg.checkpoint, self.parallel.comm)
        built_in: list[Callback] = []
        if self.parallel.is_rank0:   # one writer of metrics.jsonl, TensorBoard, console progress, profile
            built_in.append(MetricsLogger(self.output_dir, cfg.monitor.log_interval, cfg.monitor.tensorboard))
            if cfg.profiler.enable_profiling:
                built_in.append(ProfilerCallback(cfg.profiler, self.output_dir, self.device))
        self.callbacks = CallbackList([*built_in, *user_callbacks])

    # ---- construction helpers ------------------------------------------------------------------
    def _build_model(self):
        section = {"model_type": self.config.model.model_type, "architectures": self.config.model.architectures,
                   **self.config.model.extra}
        section = {k: v for k, v in section.items() if v is not None}
        try:
            model = mf_models.build_model(section, seed=self.config.training.seed)
        except mf_models.ModelConfigError as exc:
            raise TrainerConfigError(str(exc)) from None
        if self.finetune is not None:
            self.finetune.prepare_model(model)
        if self.parallel.enabled:
            # The model's plan: tensor + sequence parallelism, recompute, FSDP/HSDP, in that order.
            self.parallel.parallelize(model, self._recompute)
        else:
            self._recompute(model)
        return model

    def _recompute(self, model) -> None:
        marked = apply_recompute(model, self.config.recompute)
        if marked:
            log.info("recompute: %s", ", ".join(marked))

    def _make_runner(self) -> StepRunner:
        par, mon = self.parallel, self.config.monitor.train_state
        loss = MaskedLMLoss(self.model, par.cross_entropy())
        if not par.enabled:
            return StepRunner(loss, self.optimizer, self.config.training.max_norm, self.accumulation)
        clip = par.clip(self.model, self.optimizer.params, self.config.training.max_norm)
        return StepRunner(loss, self.optimizer, self.config.training.max_norm, self.accumulation, norm=GradNorm(clip),
                          local_norm=mon.device_norm, global_tokens=par.global_tokens, loss_scale=par.loss_scale)

    def _model_state(self) -> dict:
        """What checkpoints hold: every weight, or the adapters of a LoRA fine-tune (this rank's
        blocks as mf-ckpt ShardedTensors in a parallel run)."""
        if self.sharded is not None:
            return self.sharded.model_state()
        return self.finetune.model_state(self.model) if self.finetune else mf_models.model_state(self.model)

    def _optimizer_state(self) -> dict:
        if self.sharded is not None:
            return self.sharded.optimizer_state()
        return {k: v for k, v in self.optimizer.state_dict().items() if k != "step"}

    def _restore(self, path: str | None = None) -> None:
        """From checkpoint.load_path, or (fine-tune resume) from this run's own `path`. A parallel
        run reads this rank's blocks of every tensor (any saved layout: mf-ckpt reshards on load)."""
        if self.sharded is not None:
            model_state, opt_state = self.sharded.model_destinations(), self.sharded.optimizer_destinations()
        else:
            model_state = {k: np.array(v) for k, v in self._model_state().items()}
            opt_state = self._optimizer_state()
        restored = load_checkpoint(self.config.checkpoint, model_state, opt_state, path=path, resume=path is not None,
                                   comm=self.parallel.comm)
        try:
            if self.sharded is not None:
                self.sharded.load_model(model_state)
            elif self.finetune is not None:
                self.finetune.load_model_state(self.model, model_state)
            else:
                mf_models.load_state(self.model, model_state)
        except mf_models.ModelStateError as exc:
            raise TrainerConfigError(f"checkpoint.{'save_path' if path else 'load_path'}: {exc}") from None
        if not restored.resume:
            return
        common = restored.common
        if self.sharded is not None:
            opt_state = self.sharded.moments(opt_state)
        self.optimizer.load_state_dict({**opt_state, "step": common["optimizer_step"]})
        self.state.step = self.state.start_step = int(common["step"])
        if self.state.step > self.state.total_steps:
            raise TrainerConfigError(f"training.steps: {self.state.total_steps} is below the step of the checkpoint "
                                     f"being resumed ({self.state.step}); raise it to train further")
        self.state.consumed_samples = int(common["consumed_samples"])
        self.state.skipped_steps = int(common.get("skipped_steps", 0))
        self.state.nonfinite_in_row = int(common.get("nonfinite_in_row", 0))
        runtime.set_rng_state(common["rng"], f"checkpoint.{'save_path' if path else 'load_path'}: "
                                             f"{restored.source}/common.json")

    def _check_data(self) -> None:
        columns = self.loader.columns
        if "actual_seq_len" in columns:
            raise TrainerConfigError(
                "train_dataset.dataloader.config.create_compressed_eod_mask: the compressed EOD mask needs a "
                "variable-length attention kernel that mf-models does not have; use create_attention_mask")
        missing = [c for c in ("input_ids", "labels", "loss_mask") if c not in columns]
        if missing:
            raise TrainerConfigError(f"train_dataset.dataloader.column_names: the Trainer needs {missing[0]!r}")
        needed = (self.state.total_steps - self.state.step) * self.global_batch
        left = self.loader.total_samples - self.state.consumed_samples
        if needed > left:
            raise TrainerConfigError(
                f"train_dataset.dataloader.sizes: {self.state.total_steps - self.state.step} more steps of "
                f"{self.global_batch} samples need {needed} samples, the dataset has {left} left "
                f"({self.loader.total_samples} in all): raise sizes[0] or lower training.steps")

    # ---- checkpoint state ----------------------------------------------------------------------
    def checkpoint_common(self) -> dict:
        from mf_config import config_to_dict

        cfg = self.config
        hf_config = {"model_type": cfg.model.model_type, **cfg.model.extra}
        if cfg.model.architectures:
            hf_config["architectures"] = [cfg.model.architectures]
        return {
            "step": self.state.step, "consumed_samples": self.state.consumed_samples,
            "optimizer_step": self.optimizer.step, "skipped_steps": self.state.skipped_steps,
            "nonfinite_in_row": self.state.nonfinite_in_row, "rng": runtime.rng_state(),
            "lr_schedule": self.scheduler.describe(), "hf_config": hf_config, "train_config": config_to_dict(cfg),
            **(self.finetune.common() if self.finetune is not None else {}),
        }

    def save_checkpoint(self) -> None:
        opt = None if self.config.checkpoint.no_save_optim else self._optimizer_state()
        committed = self.checkpointer.save(self.state.step, self._model_state(), opt, self.checkpoint_common())
        self._announce(committed)

    def _announce(self, committed) -> None:
        for step, path in committed:
            log.info("checkpoint %d saved: %s", step, path)
            self.last_checkpoint = path
            self.callbacks.on_save(self, step, path)

    # ---- the loop ------------------------------------------------------------------------------
    def _run_step(self, micro_batches, lr):
        # Several ranks: no fallback. A rank that retried in PyNative would issue its collectives
        # out of step with the others; the error ends the job instead (mf launch shows it).
        if self.mode != 0 or self.state.step > self.state.start_step or self.parallel.enabled:
            return self.runner(micro_batches, lr)
        # First step in GRAPH_MODE compiles. If compiling fails, fall back to PyNative from an
        # untouched state (weights and moments snapshotted, since the error may surface late).
        weights = {k: np.array(v) for k, v in mf_models.model_state(self.model).items()}
        moments = self.optimizer.state_dict()
        try:
            return self.runner(micro_batches, lr)
        except (RuntimeError, TypeError, ValueError) as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            log.warning("GRAPH_MODE compile/run of the training step failed (%s); falling back to PyNative", reason)
            runtime.use_pynative()
            self.mode = 1
            mf_models.load_state(self.model, weights)
            self.optimizer.load_state_dict(moments)
            self.runner = self._make_runner()
            return self.runner(micro_batches, lr)

    def train(self) -> TrainResult:
        cfg, state = self.config, self.state
        result = TrainResult(step=state.step)
        self.last_checkpoint = None
        os.makedirs(self.output_dir, exist_ok=True)
        tokens_per_step = self.global_batch * self.seq_length
        self.callbacks.on_train_begin(self)
        batches = iter(self.loader)
        try:
            while state.step < state.total_steps and not self.should_stop:
                step = state.step + 1
                self.callbacks.on_step_begin(self, step)
                micro = [next(batches) for _ in range(self.accumulation)]
                lr = self.scheduler(self.optimizer.step)
                self._comm_reset()
                t0 = time.perf_counter()
                local_loss, grad_norm, applied = self._run_step(micro, lr)
                loss = self.parallel.global_loss(local_loss)
                seconds = time.perf_counter() - t0
                state.step = step
                state.consumed_samples = self.loader.consumed_samples
                state.nonfinite_in_row = 0 if applied else state.nonfinite_in_row + 1
                state.skipped_steps += 0 if applied else 1
                result.losses.append(loss)
                metrics = self._metrics(step, loss, lr, grad_norm, applied, seconds, tokens_per_step, micro, local_loss)
                self.callbacks.on_step_end(self, metrics)
                if not applied:
                    log.warning("step %d: non-finite loss or gradient norm (loss %s, grad_norm %s): update skipped "
                                "(%d in a row)", step, loss, grad_norm, state.nonfinite_in_row)
                    if state.nonfinite_in_row >= cfg.training.max_consecutive_nonfinite:
                        raise TrainingError(
                            f"{state.nonfinite_in_row} non-finite steps in a row (training.max_consecutive_nonfinite"
                            f" = {cfg.training.max_consecutive_nonfinite}); stopping at step {step}")
                # Before the save of this step: a run resumed from it must not need this evaluation again.
                if self.evaluator is not None and self.evaluator.due(step, state.total_steps, self.should_stop):
                    self.callbacks.on_evaluate(self, self.evaluator.run(step).metrics(step))
                if self.checkpointer.should_save(step):
                    self.save_checkpoint()
                else:
                    self._announce(self.checkpointer.poll())
            if (self.config.checkpoint.enable_save and state.step > state.start_step
                    and self.checkpointer.last_saved_step != state.step):
                self.save_checkpoint()
            self._announce(self.checkpointer.finalize())
        finally:
            batches.close()
            # Commit or stop an async save even when training failed, so no writer thread leaks.
            if self.checkpointer.pending:
                try:
                    self._announce(self.checkpointer.finalize())
                except TrainingError as exc:
                    log.error("%s", exc)
        if cfg.inference.prompts or cfg.inference.input_file:
            result.samples = self._samples()
        self.callbacks.on_train_end(self)
        result.step = state.step
        result.checkpoint = self.last_checkpoint
        return result

    def _comm_reset(self) -> None:
        if self.parallel.enabled:
            comm_metrics()   # drop what happened between steps (checkpoints, evaluation)

    def _samples(self) -> list[dict]:
        """The end-of-training sample: in a parallel run, every rank gathers the full weights (a
        collective) and rank 0 alone generates with a one-process copy of the model."""
        from mf_trainer.sampling import generate_samples

        cfg = self.config
        model = self.model
        if self.parallel.enabled:
            full = self.parallel.full_state(self.model)
            if not self.parallel.is_rank0:
                return []
            model = self._plain_model(full)
        return generate_samples(model, cfg.inference, cfg.tokenizer.path, cfg.training.seed)

    def _plain_model(self, full: dict):
        """A one-process model holding `full` (gathered) weights."""
        section = {"model_type": self.config.model.model_type, "architectures": self.config.model.architectures,
                   **self.config.model.extra}
        model = mf_models.build_model({k: v for k, v in section.items() if v is not None}, init=False)
        mf_models.load_state(model, full)
        return model

    def full_state(self) -> dict:
        """Every weight as its full array (on every rank: a collective in a parallel run)."""
        if self.parallel.enabled:
            return self.parallel.full_state(self.model)
        return {k: np.array(v) for k, v in mf_models.model_state(self.model).items()}

    def _metrics(self, step, loss, lr, grad_norm, applied, seconds, tokens, micro, local_loss) -> dict:
        state, mon = self.state, self.config.monitor.train_state
        world = self.parallel.world
        mfu = None
        if self.peak_flops:
            mfu = self.flops_per_token * tokens / seconds / (self.peak_flops * world)
        m = {
            "step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm, "step_time_s": seconds,
            "tokens_per_s": tokens / seconds, "mfu": mfu, "rss_bytes": host_rss_bytes(),
            "consumed_samples": state.consumed_samples, "loss_tokens": int(self.runner.last_tokens),
            "skipped": not applied, "skipped_steps": state.skipped_steps,
        }
        if self.parallel.enabled:
            m.update(comm_metrics())       # this step's communication volume, then reset
        # In one process this rank's / this device's loss and norm are the global ones. With several
        # ranks: local_loss = this rank's share of the global loss (its tokens over the global
        # count), device_loss = the mean loss over this rank's own tokens, device_norm = the norm
        # of this rank's own gradient shards.
        if mon.local_loss:
            m["local_loss"] = local_loss / self.parallel.loss_scale
        if mon.device_loss and not self.parallel.enabled:
            m["device_loss"] = loss
        elif mon.device_loss:
            own = float(sum(float(mb["loss_mask"].sum()) for mb in micro))
            m["device_loss"] = (local_loss / self.parallel.loss_scale * self.runner.last_tokens / own
                                if own else float("nan"))
        if mon.device_norm:
            m["device_norm"] = self.runner.last_local_norm if self.parallel.enabled else grad_norm
        if self.parallel.enabled and not self.parallel.is_rank0 and (mon.local_loss or mon.device_loss or
                                                                     mon.device_norm):
            log.info("rank %d step %d: %s", self.parallel.rank, step, ", ".join(
                f"{k} {m[k]:.6g}" for k in ("local_loss", "device_loss", "device_norm") if k in m))
        return m
