"""Evaluation: mean loss, perplexity and token accuracy of a model on held-out data.

Metrics, over every loss-mask token of the evaluated batches (the same token weighting as the
training loss, so `eval_loss` and `loss` are comparable):

    eval_loss     = sum(mask * (logsumexp(z) - z[label])) / sum(mask)
    eval_ppl      = exp(eval_loss)
    eval_accuracy = sum(mask * (argmax(z) == label)) / sum(mask)

Which data (`eval_data`):
  * `eval_dataset` present: a dataset of its own, in the train_dataset format. Its
    `dataloader.sizes` names the split to evaluate by giving exactly one split a non-zero size
    (`[N, 0, 0]` with split "1,0,0": all of that data; `[0, N, 0]` with split "969,30,1": the
    held-out 3% of a corpus).
  * otherwise: the valid split of `train_dataset` (Megatron's split string, e.g. "969,30,1", and
    `sizes[1]` samples of it).

How much: the first `eval_dataset.eval_iters` batches of `training.local_batch_size` samples
(default 10; the same batches at every evaluation, so successive numbers compare the model, not
the data), or fewer when the split is smaller (the log says so); `mf eval --all` takes the whole
split. Without `eval_dataset` (the valid split), `eval_iters` takes its default.

The forward is one Cell: compiled in GRAPH_MODE when training is (a second graph beside the
training step's), op by op in PyNative. The model is switched to inference mode for it (LoRA
dropout off) and back. Evaluation draws no random numbers and has its own loader, so it changes
neither the training data order nor any RNG: a run with periodic evaluation trains exactly as one
without.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from mf_trainer.data import build_loader
from mf_trainer.errors import TrainerConfigError
from mf_trainer.loss import token_cross_entropy
from mf_trainer.preflight.data import eval_data as _eval_data
from mf_trainer.step import batch_model_inputs, loss_targets

log = logging.getLogger("mf_trainer")

class EvalForward(nn.Cell):
    """(labels, loss_mask, *model_inputs) -> (sum of masked loss, tokens, correct tokens).

    `cross_entropy` / `argmax`: the vocab-parallel loss and argmax when tensor parallelism leaves
    the logits split along the vocabulary (ParallelContext.cross_entropy / .argmax), the same loss
    the TP training step uses; None: the one-process ones. Forward only: nothing is differentiated."""

    def __init__(self, model, cross_entropy: nn.Cell | None = None, argmax: nn.Cell | None = None):
        super().__init__(auto_prefix=False)
        self.model = model
        self.vocab_parallel = cross_entropy is not None
        self.cross_entropy = cross_entropy
        self.vocab_argmax = argmax

    def construct(self, labels, loss_mask, *model_inputs):
        return self.sums(self.model(*model_inputs), labels, loss_mask)

    def sums(self, logits, labels, loss_mask):
        """(sum of masked loss, tokens, correct tokens) of logits [B, S, V] (or vocab shards)."""
        targets = labels.reshape(-1)
        mask = loss_mask.reshape(-1)
        if self.vocab_parallel:
            per_token = self.cross_entropy(logits, labels).reshape(-1)
            predicted = self.vocab_argmax(logits).reshape(-1)
        else:
            vocab = logits.shape[-1]
            flat = logits.reshape(-1, vocab).astype(ms.float32)
            per_token = token_cross_entropy(flat, targets)
            predicted = ops.argmax(flat, -1).astype(ms.int32)
        correct = ops.equal(predicted, targets).astype(ms.float32)
        return (per_token * mask).sum(), mask.sum(), (correct * mask).sum()


@dataclass
class EvalResult:
    loss: float
    ppl: float
    accuracy: float
    tokens: int
    batches: int
    samples: int
    seconds: float
    data: str  # which data: "eval_dataset (train split)", "train_dataset (valid split)"
    compile_seconds: float = 0.0   # compiling the forward (GRAPH_MODE's first evaluation), not in `seconds`
    weights: str = ""              # which weights (mf eval: what sources.weights_for_inference chose)

    def metrics(self, step: int | None = None) -> dict:
        m = {"eval_loss": self.loss, "eval_ppl": self.ppl, "eval_accuracy": self.accuracy,
             "eval_tokens": self.tokens, "eval_batches": self.batches, "eval_time_s": self.seconds}
        if self.compile_seconds:
            m["eval_compile_s"] = self.compile_seconds
        return m if step is None else {"step": step, **m}


def eval_data(cfg) -> tuple[object, str, str]:
    """(dataset section, its YAML name, split phase) this config evaluates on."""
    try:
        return _eval_data(cfg)
    except ValueError as exc:
        raise TrainerConfigError(str(exc)) from None


class Evaluator:
    """Evaluates `model` on this config's evaluation data (see the module docstring).

    `iters`: batches per evaluation (None = the whole split). `interval`: evaluate every that many
    training steps (None = only at the end of training)."""

    def __init__(self, cfg, model, *, micro_batch_size: int, iters: int | None, interval: int | None = None,
                 parallel=None, pipeline=None):
        section, where, phase = eval_data(cfg)
        self.where = f"{where} ({phase} split)"
        self.loader = build_loader(cfg, micro_batch_size=micro_batch_size, section=section, where=where, phase=phase)
        available = len(self.loader)
        self.batches = available if iters is None else min(int(iters), available)
        if iters is not None and available < iters:
            log.info("evaluation: %s has %d batches of %d samples, fewer than eval_iters %d: evaluating all of them",
                     self.where, available, micro_batch_size, iters)
        self.model = model
        self.interval = interval
        # Under a layout (the Trainer's ParallelContext): vocab-split logits (tp), this rank's
        # sequence chunks (cp, sums added over cp), the stages' forward (pp, the pipeline plan's
        # executor; sums from the last stage, shared over pp). Every rank reads every batch.
        self.parallel = parallel
        self.pipeline = pipeline
        self.forward = EvalForward(model, *((parallel.cross_entropy(), parallel.argmax()) if parallel else ()))
        self.compiled = False
        self.last_step: int | None = None

    def due(self, step: int, total_steps: int, stopping: bool) -> bool:
        """Every `interval` steps, and after the last step (planned or stopped by a callback)."""
        every = self.interval is not None and step % self.interval == 0
        return every or step >= total_steps or stopping

    def run(self, step: int | None = None) -> EvalResult:
        t0 = time.perf_counter()
        was_training = self.model.training
        self.model.set_train(False)
        self.loader.load_state_dict({"consumed_samples": 0})
        batches = iter(self.loader)
        loss_sum = tokens = correct = 0.0
        samples = 0
        compiling = 0.0
        try:
            for _ in range(self.batches):
                mb = next(batches)
                samples += len(mb["input_ids"])
                if self.parallel is not None:
                    mb = self.parallel.shard_sequence(mb)     # cp: this rank's chunks of every sequence
                if self.pipeline is not None:
                    part = self._pipeline_sums(mb)
                    loss_sum, tokens, correct = loss_sum + part[0], tokens + part[1], correct + part[2]
                    continue
                if not self.compiled and ms.get_context("mode") == ms.GRAPH_MODE:
                    # Compiled ahead of its first call, so the evaluation's time is its own.
                    c0 = time.perf_counter()
                    self.forward.compile(*loss_targets(mb), *batch_model_inputs(mb))
                    compiling = time.perf_counter() - c0
                self.compiled = True
                part = self.forward(*loss_targets(mb), *batch_model_inputs(mb))
                loss_sum += float(part[0].asnumpy())
                tokens += float(part[1].asnumpy())
                correct += float(part[2].asnumpy())
        finally:
            batches.close()
            self.model.set_train(was_training)
        if self.parallel is not None:
            loss_sum, tokens, correct = (float(v) for v in self.parallel.sequence_sum(
                np.array([loss_sum, tokens, correct], np.float64)))
        self.last_step = step
        loss = loss_sum / tokens if tokens else float("nan")
        ppl = math.exp(loss) if loss < 700 else float("inf")
        return EvalResult(loss=loss, ppl=ppl, accuracy=correct / tokens if tokens else float("nan"),
                          tokens=int(tokens), batches=self.batches, samples=samples,
                          seconds=time.perf_counter() - t0 - compiling, data=self.where, compile_seconds=compiling)


    def _pipeline_sums(self, mb: dict) -> np.ndarray:
        """(loss sum, tokens, correct) of one batch through the pipeline stages, on every pp rank."""
        from mf_trainer.pipeline_step import micro_batch_tensors

        def last_stage(output, tensors):
            parts = self.forward.sums(self.pipeline.logits(output), tensors["labels"], tensors["loss_mask"])
            return ops.concat([p.reshape(1) for p in parts])

        return self.pipeline.executor.forward([micro_batch_tensors(mb)], last_stage, 3).asnumpy().astype(np.float64)


def build_evaluator(cfg, model, micro_batch_size: int, parallel=None, pipeline=None) -> Evaluator | None:
    """The Trainer's evaluator: with an eval_dataset section, every eval_interval steps and at the end.
    `parallel` / `pipeline`: the Trainer's ParallelContext and PipelinePlan (None: one process, or
    no pipeline); `model` is then this rank's part of the model (the stage under pp)."""
    if cfg.eval_dataset is None:
        return None
    ev = cfg.eval_dataset
    return Evaluator(cfg, model, micro_batch_size=micro_batch_size, iters=ev.eval_iters, interval=ev.eval_interval,
                     parallel=parallel, pipeline=pipeline)


def load_weights(model, ckpt_cfg) -> str:
    """Weights of `checkpoint.load_path` into `model` (mf_models.load_weights: an mf checkpoint,
    weights only; an HF directory; a LoRA adapter merged into its base). Returns what it was."""
    import mf_ckpt
    import mf_models
    from mf_trainer.checkpointing import load_options

    try:
        return mf_models.load_weights(model, ckpt_cfg.load_path, options=load_options(ckpt_cfg)).describe()
    except (mf_ckpt.CheckpointError, mf_models.ModelStateError) as exc:
        raise TrainerConfigError(f"checkpoint.load_path: {exc}") from None


# The sections that name evaluation data: not used when the data comes from elsewhere (lm-eval tasks).
DATA_SECTIONS = ("eval_dataset", "train_dataset")


def evaluated_model(cfg, weights: str | None = None, *, data: bool = True):
    """(model, cfg, description of the weights): the model `mf eval` evaluates, built and loaded
    (see `evaluate`), in the mode `context.mode` says. `data=False`: the caller brings its own data
    (lm-eval tasks), so the preflight's problems with the data sections are not this run's.
    Bad input: TrainerConfigError."""
    import mf_models
    from mf_trainer import runtime
    from mf_trainer.preflight import preflight
    from mf_trainer.preflight.registry import model_section
    from mf_trainer.sources import complete_model_section, weights_for_inference

    cfg, model_note = complete_model_section(cfg)
    cfg, weights_note = weights_for_inference(cfg, weights)
    device = runtime.resolve_device(cfg.context.device_target)
    report = preflight(cfg, "eval", runtime.world_size_from_env(), device)
    if not data:
        report.problems = [p for p in report.problems if p[0].split(".")[0] not in DATA_SECTIONS]
    report.raise_for_problems()
    runtime.setup_context(device, cfg.context.mode, cfg.context.device_id, cfg.training.deterministic)
    runtime.seed_everything(cfg.training.seed)
    try:
        model = mf_models.build_model(model_section(cfg), init=False)
    except mf_models.ModelConfigError as exc:
        raise TrainerConfigError(str(exc)) from None
    what = load_weights(model, cfg.checkpoint)   # a bad checkpoint fails before the data is indexed
    for note in (model_note, weights_note):     # said once the weights loaded: bad input stays one line
        if note:
            log.info("%s", note)
    model.set_train(False)
    return model, cfg, what


def evaluate(cfg, *, whole_split: bool = False, weights: str | None = None) -> EvalResult:
    """`mf eval`: the model of `cfg.model` (a fine-tune without one: its base's) with the weights
    sources.weights_for_inference picks (`weights` given: those; a training YAML: its run's last
    checkpoint; else checkpoint.load_path), evaluated on `eval_data(cfg)`; graph or PyNative as
    `context.mode` says. Bad input: TrainerConfigError."""
    model, cfg, what = evaluated_model(cfg, weights)
    iters = None if whole_split else (cfg.eval_dataset.eval_iters if cfg.eval_dataset is not None else _default_iters())
    evaluator = Evaluator(cfg, model, micro_batch_size=cfg.training.local_batch_size, iters=iters)
    log.info("evaluating %s on %s: %d batches of %d samples, %s mode", what, evaluator.where, evaluator.batches,
             cfg.training.local_batch_size, "GRAPH" if cfg.context.mode == 0 else "PyNative")
    result = evaluator.run()
    result.weights = cfg.checkpoint.load_path
    return result


def _default_iters() -> int:
    """mf-config's default of eval_dataset.eval_iters (the valid split has no section to set it in)."""
    import dataclasses

    import mf_config

    return next(f.default for f in dataclasses.fields(mf_config.EvalDatasetConfig) if f.name == "eval_iters")
