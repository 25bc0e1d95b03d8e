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

The run directory (session.py): a rerun of the same config resumes its own last checkpoint
(rundir.py decides, run_identity.py says what "the same run" is), another run's outputs are
refused by the preflight unless `overwrite`, and every session leaves config.yaml, train.log,
metrics.jsonl and summary.json behind. A run that ran all its steps but skipped too many of them,
or whose final loss is not finite, raises TrainingError at the end (after its last checkpoint).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

import mf_models
from mf_trainer import run_identity, runtime
from mf_trainer.callbacks import Callback, CallbackList, build_callbacks
from mf_trainer.checkpointing import CheckpointSaver, carried, load_checkpoint
from mf_trainer.data import build_loader
from mf_trainer.demo_data import prepare_demo_data
from mf_trainer.errors import TrainerConfigError, TrainingError
from mf_trainer.evaluation import build_evaluator
from mf_trainer.heartbeat import watch_for_hangs
from mf_trainer.loss import MaskedLMLoss
from mf_trainer.lr_schedulers import build_scheduler
from mf_trainer.metrics import host_rss_bytes, peak_flops_per_device, raise_cpu_peak, training_flops_per_token
from mf_trainer.moe import MoETraining
from mf_trainer.monitor import MetricsLogger
from mf_trainer.mtp import MTPLMLoss, MTPTraining
from mf_trainer.optimizer import build_optimizer
from mf_trainer.parallel import ParallelContext, ShardedState, comm_metrics
from mf_trainer.param_norms import norm_metrics, select_parameters
from mf_trainer.pipeline_step import pipeline_plan
from mf_trainer.preflight import preflight
from mf_trainer.preflight.data import accumulation
from mf_trainer.preflight.registry import model_section
from mf_trainer.profiling import ProfilerCallback
from mf_trainer.recompute import apply_recompute
from mf_trainer.rundir import inspect_run, probe_writable
from mf_trainer.session import RunSession, fp16_hint, hparams
from mf_trainer.sources import complete_model_section
from mf_trainer.start import start_plan
from mf_trainer.step import GradNorm, StepResult, StepRunner
from mf_trainer.swap import GRAPH_MODE_BLOCKER as SWAP_GRAPH_MODE_BLOCKER
from mf_trainer.swap import SwapReport, apply_swap

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


def _count(n: int) -> str:
    """12,345 / 12.35M / 8.03B."""
    return f"{n:,}" if n < 10**6 else (f"{n / 1e6:.2f}M" if n < 10**9 else f"{n / 1e9:.2f}B")


class Trainer:
    """`overwrite`: output_dir / save_path may hold earlier outputs; this run's own kinds of file
    there are removed before its first step (rundir.py lists exactly which), instead of refused."""

    def __init__(self, config, callbacks: list[Callback] | tuple = (), *, overwrite: bool = False):
        self.started = time.time()     # the session's start in metrics.jsonl (wall time includes set-up)
        self.session = None
        try:
            self._setup(config, callbacks, overwrite)
        except BaseException:
            if self.session is not None:
                self.session.close()
            raise

    def _setup(self, config, callbacks, overwrite: bool) -> None:
        config, model_note = complete_model_section(config)   # a fine-tune without `model`: its base's
        self.config = cfg = config
        self.should_stop = False
        self.device = runtime.resolve_device(cfg.context.device_target)
        world = runtime.world_size_from_env()
        report = preflight(cfg, "train", world, self.device, overwrite=overwrite)
        report.raise_for_problems()   # every refusal; the accepted knobs with nothing to act on are said once below
        # The `parallelism` section resolved once (mf_parallel.Layout, by the preflight for this world
        # and device): the context, the model's plan and the pipeline plan take this object.
        self.layout = report.layout
        self.run_directory = inspect_run(cfg, overwrite=overwrite)
        self.session = RunSession(cfg, self.run_directory)
        self.session.announce([model_note, *report.notice_lines()])
        dims = self.layout.dims
        dp = dims.dp
        self.accumulation = accumulation(cfg.training, dp)
        self.global_batch = self.accumulation * dp * cfg.training.local_batch_size
        if self.global_batch != cfg.training.global_batch_size:
            log.info("training.global_batch_size %d is not a multiple of dp x local_batch_size; using %d "
                     "(floor division, as specified)", cfg.training.global_batch_size, self.global_batch)
        self.output_dir = cfg.output_dir  # created by prepare_outputs(): a refused config writes nothing
        self._outputs_ready = False
        # Pure-Python parts first: a bad schedule or callback fails before any model is built.
        self.scheduler = build_scheduler(cfg.lr_scheduler.type, cfg.lr_scheduler.learning_rate,
                                         cfg.lr_scheduler.extra, total_steps=cfg.training.steps)
        user_callbacks = [*build_callbacks(cfg.callbacks), *callbacks]
        runtime.setup_context(self.device, cfg.context.mode, cfg.context.device_id, cfg.training.deterministic)
        self.mode = cfg.context.mode
        self.parallel = ParallelContext(cfg, self.layout)    # joins the world (collective) when there are ranks
        self.session.set_writer(self.parallel.is_rank0)
        self.heartbeat = watch_for_hangs(cfg.training.hang_timeout_s)
        blocker = self.parallel.graph_mode_blocker()
        if dims.pp > 1:   # the pipeline executor runs per micro-batch (pipeline_step.py)
            blocker = "the pipeline executor differentiates each micro-batch of each stage in PyNative"
        if cfg.swap.enable and not blocker:
            blocker = SWAP_GRAPH_MODE_BLOCKER
        if blocker and self.mode == 0:
            log.warning("context.mode 0: %s; training in PyNative", blocker)
            runtime.use_pynative()
            self.mode = 1
        runtime.seed_everything(cfg.training.seed)

        # Where the weights come from and what a checkpoint holds (run_mode train / finetune).
        self.start = start_plan(cfg, cfg.training.seed, self.run_directory)
        self.offload = None           # swap's ActivationOffload, set while the model's plan is applied
        self.model = self._build_model()
        # Balance loss, expert-bias update and routing metrics of MoE models (inactive for dense ones).
        self.moe = MoETraining(self.model, self.model.args, cfg.monitor.moe_monitor,
                               self.parallel)
        # Multi-token prediction's metrics (models built with MTP modules; inactive otherwise).
        self.mtp = MTPTraining(self.model, self.parallel)
        # pipeline_parallel > 1: this rank keeps its stage of the model (pipeline_step.py), None otherwise.
        self.pipeline = pipeline_plan(self.parallel, self.model, self.accumulation)
        whole_model = self.model
        self.model_args = whole_model.args   # a pipeline stage below has no args of its own
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
            self._beat(0, "loading the checkpoint")
            self._restore(*source)
        self._beat(self.state.step, "setting up")
        self.loader = self._build_loader()
        self._check_data()
        self.evaluator = build_evaluator(cfg, self.model, cfg.training.local_batch_size, self.parallel, self.pipeline)
        self.runner = self._make_runner()

        self.seq_length = self.loader.config.sequence_length
        self.flops_per_token = training_flops_per_token(whole_model, self.seq_length)
        self.peak_flops, peak_source = peak_flops_per_device(self.device, cfg.monitor.peak_flops_per_device)
        log.info("device %s, %s mode; peak %s FLOP/s (%s); accumulation %d x %d samples", self.device,
                 "GRAPH" if self.mode == 0 else "PyNative",
                 f"{self.peak_flops:.3g}" if self.peak_flops else "unknown", peak_source, self.accumulation,
                 cfg.training.local_batch_size)
        log.info("parameters: %s", self._parameter_counts())
        self.checkpointer = CheckpointSaver(cfg.checkpoint, self.parallel.comm, carried(cfg))
        built_in: list[Callback] = []
        self.metrics_logger = None
        if self.parallel.is_rank0:   # one writer of metrics.jsonl, TensorBoard, console progress, profile
            self.metrics_logger = MetricsLogger(self.output_dir, cfg.monitor.log_interval, cfg.monitor.tensorboard,
                                                hparams=hparams(cfg))
            built_in.append(self.metrics_logger)
        if cfg.profiler.enable_profiling:   # every rank profiler.profiler_rank names (null: every rank)
            built_in.append(ProfilerCallback(cfg.profiler, self.output_dir, self.device, self.parallel.rank,
                                             self.parallel.world))
        if self.offload is not None and self.parallel.is_rank0:
            built_in.append(SwapReport(self.offload))
        self.callbacks = CallbackList([*built_in, *user_callbacks])

    def _parameter_counts(self) -> str:
        """`12.45M total, 0.12M trainable (0.98%), 6.23M per rank`: global sizes from the layouts,
        per rank = the real blocks this rank holds (FSDP padding left out)."""
        layouts = self.parallel.layouts(self.model)
        trainable = {p.name for p in self.model.trainable_params()}
        total = trained = local = 0
        for name, lay in layouts.items():
            size = int(np.prod(lay.global_shape, dtype=np.int64))
            total += size
            trained += size if name in trainable else 0
            local += int(np.prod(lay.shape, dtype=np.int64))
        share = f" ({100.0 * trained / total:.2f}%)" if total and trained != total else ""
        return (f"{_count(total)} total, {_count(trained)} trainable{share}, {_count(local)} per rank"
                + (f" (of {self.parallel.world})" if self.parallel.world > 1 else ""))

    # ---- construction helpers ------------------------------------------------------------------
    def _build_model(self):
        try:
            # with its multi-token-prediction modules when the model has any (mtp.py)
            model = mf_models.build_model(model_section(self.config), seed=self.config.training.seed, mtp=True)
        except mf_models.ModelConfigError as exc:
            raise TrainerConfigError(str(exc)) from None
        self.start.prepare_model(model)   # base weights, LoRA adapters: before the plan
        # The model's plan: tensor + sequence parallelism, recompute and swap, FSDP/HSDP, in that order.
        self.parallel.parallelize(model, self._mark_memory)
        return model

    def _mark_memory(self, model) -> None:
        marked = apply_recompute(model, self.config.recompute)
        if marked:
            log.info("recompute: %s", ", ".join(marked))
        self.offload = apply_swap(model, self.config.swap, self.device)

    def _build_loader(self):
        cfg, par = self.config, self.parallel
        extra = cfg.train_dataset.dataloader.extra
        if "demo_corpus" in extra or "demo_sft" in extra:
            # One builder of the demo data; the other ranks find it built.
            if par.is_rank0:
                prepare_demo_data(dict(extra), cfg.tokenizer.path, cfg.model.extra.get("vocab_size"))
            par.barrier()
        return build_loader(cfg, micro_batch_size=cfg.training.local_batch_size, dp_rank=par.dp_rank, dp_size=par.dp,
                            consumed_samples=self.state.consumed_samples, is_built_on_rank=lambda: par.is_rank0)

    def _norm_positions(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """monitor.train_state.local_norm: (positions in optimizer.params, names) (param_norms.py)."""
        if not self.config.monitor.train_state.local_norm:
            return (), ()
        by_id = {id(p): name for name, p in self.model.parameters_and_names()}
        trained = [by_id.get(id(p), p.name) for p in self.optimizer.params]
        every = None
        if self.pipeline is not None:        # the stages' vectors cover the whole model's parameters
            every = [name for name, p in self.pipeline.model.parameters_and_names() if p.requires_grad]
        return select_parameters(self.config.monitor.train_state.local_norm, trained, every)

    def _make_runner(self) -> StepRunner:
        par, cfg = self.parallel, self.config
        positions, self.norm_names = self._norm_positions()
        if self.pipeline is not None:
            return self.pipeline.runner(self.optimizer, cfg.training.max_norm,
                                        local_norm=cfg.monitor.train_state.device_norm, positions=positions)
        clip = par.clip(self.model, self.optimizer.params, cfg.training.max_norm)
        # The output projection fused with the loss (chunked; vocab-parallel under tp) where the
        # model allows it; the logits path otherwise (MaskedLMLoss says why in the log).
        head_loss = par.linear_cross_entropy()
        if self.mtp.active:       # the MoE weights of its balance loss, whether or not it has MoE layers
            loss_cell = MTPLMLoss(self.model, par.cross_entropy(), par.loss_scale / (self.accumulation * par.dp),
                                  head_loss)
        elif self.moe.active:
            loss_cell = self.moe.loss_cell(par.cross_entropy(), self.accumulation, head_loss)
        else:
            loss_cell = MaskedLMLoss(self.model, par.cross_entropy(), head_loss)
        return StepRunner(loss_cell, self.optimizer, cfg.training.max_norm,
                          self.accumulation, norm=GradNorm(clip), local_norm=cfg.monitor.train_state.device_norm,
                          global_tokens=par.global_tokens, loss_scale=par.loss_scale, positions=positions,
                          sync=par.gradient_sync(self.optimizer.params))

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
        """What the preflight could not see: whether the dataset holds enough samples, and the token
        ids of data built since (the demo corpus) against the vocabulary."""
        from mf_trainer.preflight.data import token_range_problems

        extra = self.config.train_dataset.dataloader.extra
        if "demo_corpus" in extra or "demo_sft" in extra:
            vocab = self.model_args.vocab_size
            problems = list(token_range_problems(self.config, vocab, [("train_dataset", self.config.train_dataset)]))
            if problems:
                raise TrainerConfigError(f"{problems[0][0]}: {problems[0][1]}")
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
            "run_identity": run_identity.record(cfg), **self.start.common(),
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
    def _beat(self, step: int, phase: str) -> None:
        """Where this rank is, for the launcher's hang watchdog (heartbeat.py's line if it goes silent)."""
        if self.heartbeat is not None:
            self.heartbeat.at(step, phase)

    def _run_step(self, micro_batches, lr) -> tuple[StepResult, float]:
        """(the step's result, seconds spent compiling it: GRAPH_MODE's first step only)."""
        first_compiled = self.mode == 0 and self.state.step == self.state.start_step
        if not first_compiled:
            return self.runner(micro_batches, lr), 0.0
        if not self.parallel.may_retry_step:
            compiling = self._compile(micro_batches, lr)
            return self.runner(micro_batches, lr), compiling
        # First step in GRAPH_MODE compiles. If compiling fails, fall back to PyNative from an
        # untouched state (weights and moments snapshotted, since the error may surface late).
        weights = {k: np.array(v) for k, v in mf_models.model_state(self.model).items()}
        moments = self.optimizer.state_dict()
        compiling = 0.0
        try:
            compiling = self._compile(micro_batches, lr)
            return self.runner(micro_batches, lr), compiling
        except (RuntimeError, TypeError, ValueError) as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            log.warning("GRAPH_MODE compile/run of the training step failed (%s); falling back to PyNative", reason)
            runtime.use_pynative()
            self.mode = 1
            mf_models.load_state(self.model, weights)
            self.optimizer.load_state_dict(moments)
            self.runner = self._make_runner()
            return self.runner(micro_batches, lr), compiling

    def _compile(self, micro_batches, lr) -> float:
        t0 = time.perf_counter()
        self.runner.compile(micro_batches, lr)
        seconds = time.perf_counter() - t0
        log.info("compiled the training step in %.1f s (GRAPH_MODE; not counted in step %d's time)", seconds,
                 self.state.step + 1)
        return seconds

    def prepare_outputs(self) -> None:
        """Before step 1, on every rank (each writes: logs, error logs, its checkpoint files):
        create output_dir and checkpoint.save_path and write a probe file in each, so a directory
        that permission bits call writable but is not (/proc, a read-only mount) is refused now
        (TrainerConfigError) rather than at the first save. `train()` calls it if not done."""
        if self._outputs_ready:
            return
        places = [("output_dir", self.output_dir)]
        if self.config.checkpoint.enable_save:
            places.append(("checkpoint.save_path", self.config.checkpoint.save_path))
        for key, path in places:
            problem = probe_writable(path)
            if problem:
                self.session.close()      # nothing will be trained: train.log's buffer goes with it
                raise TrainerConfigError(f"{key}: {problem}")
        self._outputs_ready = True

    def train(self) -> TrainResult:
        """Run the remaining steps; see the module docstring for what is written and when it fails."""
        state = self.state
        status, reason = "failed", None
        try:
            self.prepare_outputs()
            self.session.begin(state.start_step, state.total_steps)
        except BaseException:
            self.session.close()      # train.log's handlers leave the loggers with it
            raise
        if self.run_directory.verdict == "overwrite" and self.parallel.enabled:
            self.parallel.barrier()      # rank 0 removed the earlier outputs before anyone writes
        try:
            result = self._train()
            reason = self.session.verdict(step=state.step, skipped=state.skipped_steps,
                                          last_loss=result.losses[-1] if result.losses else None, device=self.device)
            if reason is not None:
                raise TrainingError(reason)
            status = "finished" if state.step >= state.total_steps else "stopped"
            return result
        except KeyboardInterrupt:
            status, reason = "interrupted", "KeyboardInterrupt"
            raise
        except BaseException as exc:
            if reason is None:
                reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            log.error("training failed at step %d: %s", state.step, reason)
            raise
        finally:
            self.session.end(status=status, reason=reason, state=state,
                             history=self.metrics_logger.history if self.metrics_logger is not None else None)

    def _train(self) -> TrainResult:
        cfg, state = self.config, self.state
        result = TrainResult(step=state.step)
        self.last_checkpoint = None
        tokens_per_step = self.global_batch * self.seq_length
        self.callbacks.on_train_begin(self)
        batches = iter(self.loader)
        ended = False
        try:
            while state.step < state.total_steps and not self.should_stop:
                step = state.step + 1
                self._beat(step, "training")
                self.callbacks.on_step_begin(self, step)
                micro = [self.parallel.shard_sequence(next(batches)) for _ in range(self.accumulation)]
                lr = self.scheduler(self.optimizer.step)
                comm_metrics()   # drop what happened between steps (checkpoints, evaluation)
                t0 = time.perf_counter()
                done, compiling = self._run_step(micro, lr)
                routing = self.moe.after_step(step, done)   # the expert-bias update belongs to the step
                loss = self.moe.step_loss(done, routing)
                routing.update(self.mtp.after_step(done))
                seconds = time.perf_counter() - t0 - compiling
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
                            f" = {cfg.training.max_consecutive_nonfinite}); stopping at step {step}"
                            + fp16_hint(cfg, self.device))
                # Before the save of this step: a run resumed from it must not need this evaluation again.
                if self.evaluator is not None and self.evaluator.due(step, state.total_steps, self.should_stop):
                    self._beat(step, "evaluating")
                    self.callbacks.on_evaluate(self, self.evaluator.run(step).metrics(step))
                if self.checkpointer.should_save(step):
                    self._beat(step, "saving a checkpoint")
                    self.save_checkpoint()
                else:
                    self._announce(self.checkpointer.poll())
            self._beat(state.step, "finishing")
            if (self.config.checkpoint.enable_save and state.step > state.start_step
                    and self.checkpointer.last_saved_step != state.step):
                self.save_checkpoint()
            self._announce(self.checkpointer.finalize())
            ended = True
        finally:
            batches.close()
            # Commit or stop an async save even when training failed, so no writer thread leaks.
            if self.checkpointer.pending:
                try:
                    self._announce(self.checkpointer.finalize())
                except TrainingError as exc:
                    log.error("%s", exc)
            if not ended and self.metrics_logger is not None:
                self.metrics_logger.close()   # a failed run's metrics.jsonl and TensorBoard, flushed
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
            achieved = self.flops_per_token * tokens / seconds / self.parallel.world
            if achieved > self.peak_flops and self.device == "CPU" and not self.config.monitor.peak_flops_per_device:
                # the start-up measurement read low (a busy machine): a step is a floor of the peak
                log.info("MFU: this step reached %.3g FLOP/s per rank, above the %.3g measured at start (a busy "
                         "machine reads low); that is the peak from now on (kept in %s)", achieved, self.peak_flops,
                         raise_cpu_peak(achieved))
                self.peak_flops = achieved
            mfu = achieved / self.peak_flops
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
        m.update(norm_metrics(self.norm_names, done.param_norms))    # monitor.train_state.local_norm
        self.parallel.note_rank_values(step, m)
        return m
