"""The Trainer: one readable loop composing data, model, optimizer, schedule, step and callbacks.

    trainer = Trainer(mf_config.load_config("train.yaml"))
    result = trainer.train()

Construction does every check and every expensive preparation (device, model, optimizer, data,
checkpoint restore), so a bad YAML fails before the first step. `train()` runs
`training.steps` optimizer steps; each step draws `accumulation` micro-batches of
`local_batch_size` samples (accumulation = global_batch_size // (dp x local_batch_size)), feeds
the scheduler's LR, and hands the metrics to the callbacks (logging and checkpointing are
built in; `callbacks:` adds more).

One path for every layout: one process is the layout of one rank (parallel.py: the layout, the
model's plan, data slices, global-token loss, global-norm clipping and sharded checkpoint state,
all the identity at world size 1), and fine-tuning is a choice of state (start.py: which weights
start, which tensors train and which a checkpoint holds), not a branch. Started on several ranks
(`mf launch`, msrun), every rank runs this same loop on its share of the work; the loss, norm and
decisions are global, so every rank takes the same path. Rank 0 alone writes metrics,
TensorBoard, console progress and the end-of-training sample.
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
from mf_trainer.checkpointing import CheckpointSaver, carried, load_checkpoint
from mf_trainer.data import build_loader, ensure_demo_corpus
from mf_trainer.errors import TrainerConfigError, TrainingError
from mf_trainer.evaluation import build_evaluator
from mf_trainer.loss import MaskedLMLoss
from mf_trainer.lr_schedulers import build_scheduler
from mf_trainer.metrics import host_rss_bytes, peak_flops_per_device
from mf_trainer.moe import MoETraining
from mf_trainer.monitor import MetricsLogger
from mf_trainer.optimizer import build_optimizer
from mf_trainer.parallel import ParallelContext, ShardedState, build_dims, comm_metrics
from mf_trainer.pipeline_step import pipeline_plan
from mf_trainer.preflight import preflight
from mf_trainer.preflight.data import accumulation
from mf_trainer.preflight.registry import model_section
from mf_trainer.profiling import ProfilerCallback
from mf_trainer.recompute import apply_recompute
from mf_trainer.start import start_plan
from mf_trainer.step import GradNorm, StepResult, StepRunner

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


class Trainer:
    def __init__(self, config, callbacks: list[Callback] | tuple = ()):
        self.config = cfg = config
        self.should_stop = False
        self.device = runtime.resolve_device(cfg.context.device_target)
        world = runtime.world_size_from_env()
        preflight(cfg, "train", world, self.device).raise_for_problems()   # every refusal, before any work
        dims = build_dims(cfg, world)
        dp = dims.dp
        self.accumulation = accumulation(cfg.training, dp)
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
        if dims.pp > 1:   # the pipeline executor runs per micro-batch (pipeline_step.py)
            blocker = "the pipeline executor differentiates each micro-batch of each stage in PyNative"
        if blocker and self.mode == 0:
            log.warning("context.mode 0: %s (mf_parallel.graph_mode_blocker); training in PyNative", blocker)
            runtime.use_pynative()
            self.mode = 1
        runtime.seed_everything(cfg.training.seed)

        # Where the weights come from and what a checkpoint holds (run_mode train / finetune).
        self.start = start_plan(cfg, cfg.training.seed)
        self.model = self._build_model()
        # Balance loss, expert-bias update and routing metrics of MoE models (inactive for dense ones).
        self.moe = MoETraining(self.model, self.model.args, cfg.monitor.moe_monitor,
                               self.parallel)
        # pipeline_parallel > 1: this rank keeps its stage of the model (pipeline_step.py), None otherwise.
        self.pipeline = pipeline_plan(cfg, self.parallel, self.model, self.accumulation)
        whole_model = self.model
        if self.pipeline is not None:
            self.model = self.pipeline.stage
        self.optimizer = build_optimizer(self.model, cfg.optimizer, self.parallel)   # AdamW or Muon
        if self.pipeline is not None:
            self.sharded = self.pipeline.sharded_state(self.optimizer, self.start.held(self.model))
        else:
            self.sharded = ShardedState(self.parallel, self.model, self.optimizer, self.start.held(self.model))
        self.state = TrainState(total_steps=cfg.training.steps)
        source = self.start.restore_source()
        if source is not None:
            self._restore(*source)
        self.loader = self._build_loader()
        self._check_data()
        self.evaluator = build_evaluator(cfg, self.model, cfg.training.local_batch_size)
        self.runner = self._make_runner()

        self.seq_length = self.loader.config.sequence_length
        self.flops_per_token = whole_model.num_flops_per_token(self.seq_length)
        self.peak_flops, peak_source = peak_flops_per_device(self.device, cfg.monitor.peak_flops_per_device)
        log.info("device %s, %s mode; peak %s FLOP/s (%s); %.2fM parameters; accumulation %d x %d samples",
                 self.device, "GRAPH" if self.mode == 0 else "PyNative",
                 f"{self.peak_flops:.3g}" if self.peak_flops else "unknown", peak_source,
                 sum(p.size for p in self.model.trainable_params()) / 1e6, self.accumulation,
                 cfg.training.local_batch_size)
        self.checkpointer = CheckpointSaver(cfg.checkpoint, self.parallel.comm, carried(cfg))
        built_in: list[Callback] = []
        if self.parallel.is_rank0:   # one writer of metrics.jsonl, TensorBoard, console progress, profile
            built_in.append(MetricsLogger(self.output_dir, cfg.monitor.log_interval, cfg.monitor.tensorboard))
            if cfg.profiler.enable_profiling:
                built_in.append(ProfilerCallback(cfg.profiler, self.output_dir, self.device))
        self.callbacks = CallbackList([*built_in, *user_callbacks])

    # ---- construction helpers ------------------------------------------------------------------
    def _build_model(self):
        try:
            model = mf_models.build_model(model_section(self.config), seed=self.config.training.seed)
        except mf_models.ModelConfigError as exc:
            raise TrainerConfigError(str(exc)) from None
        self.start.prepare_model(model)   # base weights, LoRA adapters: before the plan
        # The model's plan: tensor + sequence parallelism, recompute, FSDP/HSDP, in that order.
        self.parallel.parallelize(model, self._recompute)
        return model

    def _recompute(self, model) -> None:
        marked = apply_recompute(model, self.config.recompute)
        if marked:
            log.info("recompute: %s", ", ".join(marked))

    def _build_loader(self):
        cfg, par = self.config, self.parallel
        if "demo_corpus" in cfg.train_dataset.dataloader.extra:
            # One builder of the demo corpus; the other ranks find it built.
            if par.is_rank0:
                ensure_demo_corpus(dict(cfg.train_dataset.dataloader.extra), cfg.tokenizer.path,
                                   cfg.model.extra.get("vocab_size"))
            par.barrier()
        return build_loader(cfg, micro_batch_size=cfg.training.local_batch_size, dp_rank=par.dp_rank, dp_size=par.dp,
                            consumed_samples=self.state.consumed_samples, is_built_on_rank=lambda: par.is_rank0)

    def _make_runner(self) -> StepRunner:
        par, cfg = self.parallel, self.config
        if self.pipeline is not None:
            return self.pipeline.runner(self.optimizer, cfg.training.max_norm,
                                        local_norm=cfg.monitor.train_state.device_norm)
        clip = par.clip(self.model, self.optimizer.params, cfg.training.max_norm)
        loss_cell = (self.moe.loss_cell(par.cross_entropy(), self.accumulation) if self.moe.active
                     else MaskedLMLoss(self.model, par.cross_entropy()))
        return StepRunner(loss_cell, self.optimizer, cfg.training.max_norm,
                          self.accumulation, norm=GradNorm(clip), local_norm=cfg.monitor.train_state.device_norm,
                          global_tokens=par.global_tokens, loss_scale=par.loss_scale)

    def _restore(self, path: str | None, resume: bool) -> None:
        """From checkpoint.load_path, or (`resume`: a fine-tune continuing itself) from this run's
        own `path`. Each rank reads its blocks of every held tensor (any saved layout: mf-ckpt
        reshards on load)."""
        model_state, opt_state = self.sharded.model_destinations(), self.sharded.optimizer_destinations()
        restored = load_checkpoint(self.config.checkpoint, model_state, opt_state, path=path, resume=resume,
                                   comm=self.parallel.comm)
        self.sharded.load_model(model_state)
        if not restored.resume:
            return
        common = restored.common
        self.optimizer.load_state_dict({**self.sharded.moments(opt_state), "step": common["optimizer_step"]})
        self.state.step = self.state.start_step = int(common["step"])
        if self.state.step > self.state.total_steps:
            raise TrainerConfigError(f"training.steps: {self.state.total_steps} is below the step of the checkpoint "
                                     f"being resumed ({self.state.step}); raise it to train further")
        self.state.consumed_samples = int(common["consumed_samples"])
        self.state.skipped_steps = int(common.get("skipped_steps", 0))
        self.state.nonfinite_in_row = int(common.get("nonfinite_in_row", 0))
        self._restore_rng(common.get("rng"), "checkpoint.save_path" if resume else "checkpoint.load_path",
                          f"{restored.source}/common.json")

    def _restore_rng(self, state, key: str, where: str) -> None:
        if not self.config.checkpoint.load_rng_state:
            log.info("checkpoint.load_rng_state false: the RNGs continue from training.seed, not from %s", where)
            return
        try:
            runtime.set_rng_state(state)
        except runtime.RNGStateError as exc:
            raise TrainerConfigError(f"{key}: {where}: {exc}") from None

    def _check_data(self) -> None:
        """What the preflight cannot know from the config: whether the dataset holds enough samples."""
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
            **self.start.common(),
        }

    def save_checkpoint(self) -> None:
        opt = None if self.config.checkpoint.no_save_optim else self.sharded.optimizer_state()
        committed = self.checkpointer.save(self.state.step, self.sharded.model_state(), opt, self.checkpoint_common())
        self._announce(committed)

    def _announce(self, committed) -> None:
        for step, path in committed:
            log.info("checkpoint %d saved: %s", step, path)
            self.last_checkpoint = path
            self.callbacks.on_save(self, step, path)

    # ---- the loop ------------------------------------------------------------------------------
    def _run_step(self, micro_batches, lr) -> StepResult:
        first_compiled = self.mode == 0 and self.state.step == self.state.start_step
        if not (first_compiled and self.parallel.may_retry_step):
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
                micro = [self.parallel.shard_sequence(next(batches)) for _ in range(self.accumulation)]
                lr = self.scheduler(self.optimizer.step)
                comm_metrics()   # drop what happened between steps (checkpoints, evaluation)
                t0 = time.perf_counter()
                done = self._run_step(micro, lr)
                routing = self.moe.after_step(step, done)   # the expert-bias update belongs to the step
                loss = self.parallel.global_loss(done.loss)
                seconds = time.perf_counter() - t0
                state.step = step
                state.consumed_samples = self.loader.consumed_samples
                state.nonfinite_in_row = 0 if done.applied else state.nonfinite_in_row + 1
                state.skipped_steps += 0 if done.applied else 1
                result.losses.append(loss)
                self.callbacks.on_step_end(self, {**self._metrics(step, loss, lr, done, seconds, tokens_per_step, micro),
                                                  **routing})
                if not done.applied:
                    log.warning("step %d: non-finite loss or gradient norm (loss %s, grad_norm %s): update skipped "
                                "(%d in a row)", step, loss, done.grad_norm, state.nonfinite_in_row)
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

    def _samples(self) -> list[dict]:
        """The end-of-training sample, generated by rank 0 with the model as one process holds it
        (several ranks gather the full weights first: a collective)."""
        from mf_trainer.sampling import generate_samples

        cfg = self.config
        if self.pipeline is not None:
            full = self.full_state()
            model = self._plain_model(full) if self.parallel.is_rank0 else None
        else:
            model = self.parallel.one_process_model(self.model, self._plain_model)
        return [] if model is None else generate_samples(model, cfg.inference, cfg.tokenizer.path, cfg.training.seed)

    def _plain_model(self, full: dict):
        """A one-process model holding `full` (gathered) weights."""
        model = mf_models.build_model(model_section(self.config), init=False)
        mf_models.load_state(model, full)
        return model

    def full_state(self) -> dict:
        """Every weight as its full array (on every rank: a collective with several ranks)."""
        if self.pipeline is not None:
            return self.pipeline.full_state()
        return self.parallel.full_state(self.model)

    def _metrics(self, step, loss, lr, done: StepResult, seconds, tokens, micro) -> dict:
        state, mon, scale = self.state, self.config.monitor.train_state, self.parallel.loss_scale
        mfu = None
        if self.peak_flops:
            mfu = self.flops_per_token * tokens / seconds / (self.peak_flops * self.parallel.world)
        m = {
            "step": step, "loss": loss, "lr": lr, "grad_norm": done.grad_norm, "step_time_s": seconds,
            "tokens_per_s": tokens / seconds, "mfu": mfu, "rss_bytes": host_rss_bytes(),
            "consumed_samples": state.consumed_samples, "loss_tokens": int(done.tokens),
            "skipped": not done.applied, "skipped_steps": state.skipped_steps, **comm_metrics(),
        }
        # local_loss = this rank's share of the global loss (its tokens over the global count),
        # device_loss = the mean loss over this rank's own tokens, device_norm = the norm of this
        # rank's own gradient shards. On one rank: the global loss and norm.
        if mon.local_loss:
            m["local_loss"] = done.loss / scale
        if mon.device_loss:
            own = float(sum(float(mb["loss_mask"].sum()) for mb in micro))
            m["device_loss"] = done.loss / scale * (done.tokens / own) if own else float("nan")
        if mon.device_norm:
            m["device_norm"] = done.local_norm
        self.parallel.note_rank_values(step, m)
        return m
