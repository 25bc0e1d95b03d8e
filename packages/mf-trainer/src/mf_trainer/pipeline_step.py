"""Pipeline-parallel training (`parallelism.pipeline_parallel > 1`): the Trainer's model, step,
norm and checkpoint state when every pipeline rank holds a part of the model.

    plan = pipeline_plan(parallel, model, accumulation)   # None when pipeline_parallel is 1
    stage = plan.stage                  # this rank's parameters under their global names
    runner = plan.runner(optimizer, max_norm, local_norm)       # a StepRunner: (micro_batches, lr) -> StepResult
    plan.sharded_state(optimizer, held)  # checkpoint state in the global layout
    plan.full_state()                    # every weight as one process holds it (collective)

The Trainer keeps its one loop; this module swaps what differs:

* the model: every rank builds the whole model from the seed (so every stage starts from the
  one-process weights), applies its plan, then keeps its stage (`mf_models.pipeline_stage`): the
  layers `pipeline_parallel_layers_per_stage` gives it, the embedding on the first virtual stage,
  the final norm and head on the last. The optimizer is built over the stage's parameters only.
* micro-batches: the accumulation count (global_batch_size // (dp x local_batch_size)) is the
  schedule's micro-batch count; every pipeline rank of a data-parallel slice reads the same
  samples (the first stage needs the ids, every stage their shape and positions, the last the
  labels).
* the step: mf-parallel's `PipelineExecutor` runs the schedule (gpipe, 1f1b, interleaved,
  dx/dw split, zbv) and returns the summed gradients of the stage's parameters and the step's
  loss (computed on the last stage and summed over the pipeline group, so every rank logs it).
  Tied embeddings: the last stage's copy of the table and the first stage's are summed between
  the two ranks by the executor, so both take the same optimizer step. The gradients then go
  through the one-process apply step (step.py's `ApplyStep`: global-norm clipping, the
  non-finite skip, AdamW), so nothing about clipping or the update is written twice.
* the loss: the last stage returns its final-norm hidden states and the loss is fused with the
  output projection (mf-parallel's `LinearCrossEntropy`, chunk by chunk, vocab-parallel under tp;
  the head's weight gradient is made in its forward), as the one-process `MaskedLMLoss` does;
  evaluation takes the logits from the same chunk (`PipelinePlan.logits`).
* the norm: `GlobalNormClip` sums squares over the world (pp ranks hold different parameters);
  the tied copy on the last stage is left out, so every parameter is counted once.
* FSDP / tensor parallelism inside the stages (every schedule; DDP / HSDP stages are refused by
  the preflight): the plan applied before the cut is the whole story. FSDP gathers and
  reduce-scatters each stage's parameters over the stage's own dp group in every micro-batch's
  forward and backward (a split backward's deferred weight gradients are reduce-scattered when
  their W runs: mf-parallel's weight_grad.py); the TP
  plan's last stage projects onto its vocabulary slice inside the vocab-parallel loss; the tied head is the
  plan's `output` leaf sharing the table, summed with the first stage's as above. Each dp slice
  reads its own micro-batches; the Trainer sums the loss over dp. DDP stages (`no_shard`) are the
  same plan with a shard group of one: each micro-batch's backward all-reduces the stage's
  gradients over its dp group (`dp_replicate`), so every replica applies the same summed gradient.
* MoE models: each chunk holding routed layers adds their balance loss to the step's objective per
  micro-batch, weighted as the one-process `MoELMLoss` weights it (loss_scale / (accumulation x
  dp)), and differentiates it in its own backward (mf_models' `train_routing`, mf-parallel's side
  outputs). The step's `extras` are the one-process ones: this rank's share of the balance loss
  (its chunks'), and the whole model's tokens per expert [L, E] and dispatch counts [L, 2], each
  stage filling its own layers' rows (summed over micro-batches); `MoETraining.after_step` adds
  them up over the world (the other stages' rows are theirs, the other dp slices' tokens theirs),
  so every rank updates every layer's expert bias from the same loads, its own layers' included.
* checkpoints: each stage saves its parameters under their global names; the tied copy is saved
  as a replica (replica_id > 0), so a checkpoint holds one `tok_embeddings.weight` and loads into
  one process, or into another pipeline layout, unchanged (mf-ckpt reshards on load).
"""

from __future__ import annotations

import dataclasses
import logging

import mindspore as ms
import numpy as np
from mindspore import Tensor

import mf_config
import mf_models
import mf_parallel as mp
from mf_trainer.errors import TrainerConfigError
from mf_trainer.loss import token_cross_entropy
from mf_trainer.mtp import PipelineMTPLoss, inverse_tokens
from mf_trainer.parallel import ShardedState
from mf_trainer.step import (
    ApplyStep,
    GradNorm,
    StepResult,
    batch_model_inputs,
    loss_targets,
    make_buffers,
    param_norms_of,
)

log = logging.getLogger("mf_trainer")


def stage_layout(layout: mp.Layout, num_layers: int, accumulation: int) -> tuple[mp.PipelineSpec, mp.StageLayout]:
    """The layout's schedule and the layers of every virtual stage, or one TrainerConfigError line."""
    try:
        layout.pipeline.check_microbatches(accumulation)
        return layout.pipeline, layout.stage_layout(num_layers, mf_config.pipeline_layer_placement)
    except (mp.ParallelConfigError, mf_config.ConfigError) as exc:
        raise TrainerConfigError(str(exc).strip().splitlines()[0]) from None


class _PipelineLoss:
    """loss_fn(output, mb) for the executor: sum(token loss x mask) x 1 / (global tokens), the
    Trainer's MaskedLMLoss on the last stage: from its hidden states through the output projection
    fused with the loss (`head_loss` and the last `chunk`), or from its logits (vocab-parallel when
    tp splits them)."""

    def __init__(self, cross_entropy=None, head_loss=None, chunk=None) -> None:
        self.cross_entropy = cross_entropy
        self.head_loss = head_loss
        self.chunk = chunk
        self.trained = tuple(chunk.head_trained()) if chunk is not None else ()
        self.inv_tokens = None

    def __call__(self, output, mb):
        return self.masked(output, mb["labels"], mb["loss_mask"], self.inv_tokens)

    def masked(self, output, labels, mask, inv_tokens):
        """sum(token loss x mask) x inv_tokens of the last stage's output: its final hidden states
        when the loss is fused with the projection, else its logits."""
        if self.head_loss is not None:
            terms = self.chunk.head_terms(output)
            return self.head_loss(terms, labels, mask, self.trained) * inv_tokens
        logits = output
        if self.cross_entropy is not None:
            per_token = self.cross_entropy(logits, labels).reshape(-1)
        else:
            vocab = logits.shape[-1]
            per_token = token_cross_entropy(logits.reshape(-1, vocab).astype(ms.float32), labels.reshape(-1))
        return (per_token * mask.reshape(-1)).sum() * inv_tokens


def micro_batch_tensors(mb: dict) -> dict:
    """A micro-batch as the chunks and the loss read it (Tensors under the column names)."""
    labels, mask = loss_targets(mb)
    inputs = batch_model_inputs(mb)
    out = {"input_ids": inputs[0], "labels": labels, "loss_mask": mask}
    if len(inputs) > 1:
        out["position_ids"] = inputs[1]
    if len(inputs) > 2:
        out["attention_mask"] = inputs[2]
    return out


class PipelineStepRunner:
    """The StepRunner of a pipeline rank: (micro_batches, lr) -> StepResult (see the module doc)."""

    def __init__(self, plan: PipelinePlan, optimizer, max_norm: float, *, local_norm: bool = False,
                 global_tokens=None, loss_scale: int = 1, positions: tuple = ()) -> None:
        self.plan = plan
        self.optimizer = optimizer
        self.global_tokens = global_tokens or (lambda tokens: tokens)
        self.loss_scale = int(loss_scale)
        self.accumulation = plan.schedule.microbatches
        self.loss_fn = (_PipelineLoss(head_loss=plan.parallel.linear_cross_entropy(), chunk=plan.last_chunk)
                        if plan.fused_head else _PipelineLoss(plan.parallel.cross_entropy()))
        self.mtp_depth = plan.mtp_depth
        if self.mtp_depth:      # multi-token prediction: the last chunk returns the depths' outputs too
            self.loss_fn = PipelineMTPLoss(self.loss_fn.masked, self.mtp_depth,
                                           float(plan.model.args.mtp_loss_scaling_factor) / self.mtp_depth)
        index = {id(p): i for i, p in enumerate(plan.executor.params)}
        missing = [p.name for p in optimizer.params if id(p) not in index]
        if missing:
            raise TrainerConfigError(f"parallelism.pipeline_parallel: trained parameters outside this stage's chunks: "
                                     f"{missing[:3]}")
        self.order = [index[id(p)] for p in optimizer.params]   # executor grads -> optimizer order
        self.buffers = make_buffers(optimizer)
        clip = plan.clip(optimizer.params, max_norm)
        self.apply = ApplyStep(optimizer, self.buffers, max_norm, GradNorm(clip), local_norm, positions,
                               plan.parallel.gradient_sync(optimizer.params))
        self.last = None                                         # the executor's StepResult (timings)

    def cells(self) -> list:
        return [self.apply]

    def __call__(self, micro_batches: list[dict], lr: float) -> StepResult:
        if self.mtp_depth:
            inv, tokens = inverse_tokens(micro_batches, self.global_tokens, self.loss_scale, self.mtp_depth)
            self.loss_fn.inv_tokens = Tensor(inv)
        else:
            tokens = self.global_tokens(float(sum(float(mb["loss_mask"].sum()) for mb in micro_batches)))
            self.loss_fn.inv_tokens = Tensor(np.float32(self.loss_scale / tokens if tokens > 0 else np.inf))
        result = self.plan.executor.step([micro_batch_tensors(mb) for mb in micro_batches], self.loss_fn)
        self.last = result
        for buf, i in zip(self.buffers, self.order):
            grad = result.grads[i]
            # A copy, not the executor's tensor: a gradient can be a view (PyNative reshapes the
            # [1, 1, H] reduction of a broadcast weight's gradient into [H] without copying), and a
            # buffer holding a view refuses ApplyStep's in-place zeroing.
            buf.set_data(grad.copy() if grad is not None else ms.ops.zeros(buf.shape, ms.float32))
        scalars = self.optimizer.scalars(lr)
        norm, finite, local, *per_param = self.apply(Tensor(result.loss, ms.float32), *scalars)
        applied = bool(finite.asnumpy())
        if applied:
            self.optimizer.step += 1
        # The executor's loss is the whole step's (summed over the pipeline ranks); the Trainer adds
        # the data-parallel shares, so each pipeline rank reports it as its data-parallel slice's.
        # A MoE step's balance loss is the exception: each rank reports its own chunks' share beside
        # the language-model loss (MoETraining.step_loss adds the shares up over the world, as it
        # does where tensor or context parallelism split the sequences).
        loss = result.loss - result.side_loss + result.local_side_loss
        extras = self.plan.routing_extras(result)
        if self.mtp_depth:       # the depths' losses after the routing extras, as the one-process MTPLMLoss
            extras = self.plan.mtp_extras(extras) + (self.loss_fn.take(),)
        return StepResult(loss, float(norm.asnumpy()), applied, tokens, float(local.asnumpy()),
                          extras, param_norms=param_norms_of(per_param[0] if per_param else None))


class PipelineShardedState(ShardedState):
    """ShardedState of a stage; the last stage's copy of a tied table (and its moments) is saved as
    a replica under the table's global name (`global_names`: id -> the whole model's name), so the
    checkpoint holds the table once under its global name. (Under tensor parallelism the copy is
    the plan's `output` leaf sharing the table: its stage name `output.weight` is not the table's.)"""

    def __init__(self, ctx, model, optimizer, held=None, *, copies: set[int] = frozenset(), offset: int = 1,
                 global_names: dict[int, str] | None = None):
        super().__init__(ctx, model, optimizer, held)
        global_names = global_names or {}
        names = {name for name, p in model.parameters_and_names() if id(p) in copies}
        # Stage name -> checkpoint name, for the copies whose stage path is not the table's name.
        self.rename = {name: global_names[id(p)] for name, p in model.parameters_and_names()
                       if id(p) in copies and global_names.get(id(p), name) != name}

        def replica(lay):
            return dataclasses.replace(lay, replica_id=lay.replica_id + offset)

        self.layouts = {self.rename.get(k, k): replica(v) if k in names else v for k, v in self.layouts.items()}
        self.params = {self.rename.get(k, k): p for k, p in self.params.items()}
        # The optimizer keys moments by the Parameter's own name, which is the table's global one.
        names |= set(self.rename.values())
        self.moment_layouts = {k: replica(v) if k.split(".", 1)[1] in names else v
                               for k, v in self.moment_layouts.items()}


class PipelinePlan:
    """This rank's stage, executor and the pieces the Trainer swaps in (see the module doc)."""

    def __init__(self, parallel, model, accumulation: int) -> None:
        self.parallel = parallel
        self.model = model                                   # the whole model (flops, names, shapes)
        mesh = parallel.mesh
        self.spec, self.layout = stage_layout(parallel.layout, model.args.num_hidden_layers, accumulation)
        self.schedule = mp.build_schedule(self.spec, accumulation)
        mp.validate_schedule(self.schedule)
        self.pp_rank = mesh["pp"].rank
        # Every weight's global name, shape and dtype, known on every rank before the cut.
        layouts = mp.param_layouts(model, mesh)
        self.every = {name: (layouts[name].global_shape, p.asnumpy().dtype) for name, p in model.parameters_and_names()}
        try:
            self.stage = mf_models.pipeline_stage(model, self.layout, self.pp_rank,
                                                  sequence_shards=parallel.dims.tp)
        except mf_models.ModelConfigError as exc:
            raise TrainerConfigError(str(exc).strip().splitlines()[0]) from None
        # The chunk of the last virtual stage (on the rank holding it): it hands the loss its hidden
        # states and the output projection's terms, the loss fused with the projection.
        self.last_chunk = next((c for c in self.stage.chunks if c.last), None)
        problem = self.last_chunk.head_terms_problem() if self.last_chunk is not None else None
        if problem is not None:
            log.info("pipeline: the output projection is not fused with the loss (%s)", problem)
        self.fused_head = self.last_chunk is not None and problem is None
        if self.fused_head:
            self.last_chunk.head_output = False
        self.moe_layers = len(model.moe_layer_ids())
        self.mtp_depth = int(getattr(model, "mtp_depth", 0))      # its modules run on the last stage
        if self.moe_layers:            # before the executor: it reads which chunks have side outputs
            self.stage.train_routing(parallel.loss_scale / (accumulation * parallel.dp))
        self.executor = mp.PipelineExecutor(self.schedule, self.stage.chunks, mesh["pp"], tied=self.stage.tied,
                                            tied_ranks=self.layout.tied_ranks, overlap_p2p=self.spec.overlap_p2p)
        # The tied table's copy on a rank that does not hold the embedding: another rank counts it.
        holds_embedding = any(info.first for info in self.layout.chunks(self.pp_rank))
        self.copies = set() if holds_embedding else {id(p) for p in self.stage.tied}
        log.info("pipeline: %s, %d micro-batches per step; this is pipeline rank %d of %d:\n%s",
                 self.spec.describe(), accumulation, self.pp_rank, self.spec.pp, self.layout.describe())

    def routing_extras(self, result) -> tuple:
        """A MoE step's extras as the one-process step returns them: (this rank's share of the
        balance loss: its chunks', tokens per expert [L, E], dispatch counts [L, 2]) with this
        rank's layers' rows filled (the other rows and shares are the other stages'; MoETraining
        sums them over the world). () for a dense model."""
        if not self.moe_layers:
            return ()
        load = np.zeros((self.moe_layers, self.model.num_experts), np.float32)
        counts = np.zeros((self.moe_layers, 2), np.float32)
        for chunk, stats in zip(self.stage.chunks, result.stats):
            if stats:
                rows = list(chunk.moe_rows)
                load[rows] += stats[0].asnumpy()
                counts[rows] += stats[1].asnumpy()
        return np.float32(result.local_side_loss), load, counts

    def mtp_extras(self, routing: tuple) -> tuple:
        """The routing extras of a model with MTP but no MoE layer (aux 0, empty statistics), else them."""
        if routing:
            return routing
        return np.float32(0.0), np.zeros((0, 1), np.float32), np.zeros((0, 2), np.float32)

    def logits(self, output):
        """The last stage's logits from its output (its hidden states when the loss is fused; the
        model's own, not the MTP depths', of a model with multi-token prediction)."""
        if self.mtp_depth:
            output = output[0]
        return self.last_chunk.head(output) if self.fused_head else output

    def clip(self, params, max_norm: float):
        return mp.GlobalNormClip(self.stage, params, self.parallel.mesh, max_norm,
                                 counted_elsewhere=[p for p in params if id(p) in self.copies])

    def runner(self, optimizer, max_norm: float, *, local_norm: bool = False,
               positions: tuple = ()) -> PipelineStepRunner:
        par = self.parallel
        return PipelineStepRunner(self, optimizer, max_norm, local_norm=local_norm, global_tokens=par.global_tokens,
                                  loss_scale=par.loss_scale, positions=positions)

    @property
    def global_names(self) -> dict[int, str]:
        """id(parameter) -> its name in the whole model (a shared table: its first name)."""
        names: dict[int, str] = {}
        for name, p in self.model.parameters_and_names():
            names.setdefault(id(p), name)
        return names

    def sharded_state(self, optimizer, held=None) -> PipelineShardedState:
        return PipelineShardedState(self.parallel, self.stage, optimizer, held, copies=self.copies,
                                    offset=self.parallel.world, global_names=self.global_names)

    def full_state(self) -> dict[str, np.ndarray]:
        """Every weight of the whole model as its full array, on every rank (a collective)."""
        return mp.gather_full_state(self.stage, self.parallel.mesh, every=self.every,
                                    skip=[p for p in self.stage.tied if id(p) in self.copies])


def pipeline_plan(parallel, model, accumulation: int) -> PipelinePlan | None:
    """The pipeline plan of this rank (the schedule and stages of `parallel.layout`), or None when
    pipeline_parallel is 1."""
    if parallel.dims.pp <= 1:
        return None
    return PipelinePlan(parallel, model, accumulation)
