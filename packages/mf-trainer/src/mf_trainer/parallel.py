"""Parallel training: the `parallelism` section -> mf-parallel's mesh, the model's plan, and the
per-step collectives the Trainer needs around its compiled step.

The Trainer has one path: one process (world size 1) is the smallest layout, not a special case.
Every group then has one rank, every collective is the identity, the model's plan changes nothing,
the sharded state is the whole state and the global-norm clip is bit for bit the one-process norm.
With more ranks (started by `mf launch` or msrun):

* layout: `mf_parallel.Layout`, the `parallelism` section resolved once by the preflight for this
  world and device (the Trainer takes it from the preflight's report and hands this same object
  to the context, the model's plan and the pipeline plan; none of them reads the section).
  `data_parallel_shard_strategy: no_shard` makes every data-parallel rank a replica (DDP);
  `optim_grads_params` (ZeRO-3, the default) shards parameters, gradients and optimizer states.
  What cannot run (pipeline stages with cp, with HSDP stages or with DDP stages outside 1f1b,
  ZeRO-1/2, degrees that do not fit the world) is refused by the preflight; pipeline stages are
  pipeline_step.py.
* the model: its own plan (`mf_models.parallelize_model`: TP + SP, recompute, FSDP/HSDP), applied
  before the optimizer is built, so AdamW's moments are sharded like the parameters.
* data: each data-parallel rank reads its slice of every global batch (`dp_rank`, `dp`); tensor-
  and context-parallel partners read the same samples, and a context-parallel rank keeps its two
  zigzag chunks of every sequence (`shard_sequence`: tokens, labels, loss mask and global
  positions sliced alike; packed documents as global segment ids).
* loss: `sum(token loss * mask) / tokens of the GLOBAL batch` on every rank (the token count is
  all-reduced over the data- and context-parallel group first: a cp rank holds part of each
  sample's tokens). FSDP sums the ranks' gradients
  (`disable_gradient_division: true`, the default), which then is the gradient of the global
  loss; with `false` FSDP divides them by dp x cp, so each rank scales its loss by dp x cp to
  match. The logged loss is the sum of the ranks' shares over the data- and context-parallel group.
* clipping: `GlobalNormClip`, the true norm over every shard.
* mode: GRAPH_MODE unless `mf_parallel.graph_mode_blocker` has a reason (on CPU, layouts with two
  parallel axes), then PyNative, said once in the log.
"""

from __future__ import annotations

import logging

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

import mf_models
import mf_parallel as mp
from mf_trainer.errors import TrainerConfigError

log = logging.getLogger("mf_trainer")


class ParallelContext:
    """This rank's place in the job and the collectives the Trainer runs around its step.
    `layout`: the resolved `parallelism` section (mf_parallel.Layout, with its world split);
    `cfg`: the rest of the config (recompute_comm, for the model's plan)."""

    def __init__(self, cfg, layout: mp.Layout):
        self.cfg = cfg
        self.layout = layout
        self.dims = dims = layout.dims
        self.mesh = mp.init_mesh(dims)
        self.rank = self.mesh.rank
        self.world = dims.world_size
        self.dp_rank = dims.dp_rank(self.rank)
        self.dp = dims.dp
        # FSDP's mean divides gradients by dp_replicate x dp_shard x cp: every rank's loss is
        # scaled by the same factor, so the averaged gradient is the global loss's.
        self.divides = not layout.fsdp.disable_gradient_division and (dims.fsdp_enabled or dims.dp_replicate > 1)
        self.loss_scale = dims.dp * dims.cp if self.divides else 1
        # Every rank holding a share of the global batch's tokens: data- and context-parallel.
        self.loss_ranks = dims.dp * dims.cp
        self.dp_sum = mp.AllReduce(self.mesh["dp_cp" if dims.cp_enabled else "dp"])
        self.cp_rank = dims.coordinate("cp", self.rank)
        self._cp_sum = None                                       # evaluation's sums over cp (sequence_sum)
        self.comm = mp.Communicator() if self.world > 1 else None   # mf-ckpt's collective interface
        self.prefetcher = None     # FSDP gather prefetch, where it pays off (parallelize)
        self.deferred_syncs = None   # gradient all-reduces left to the step (parallelize, gradient_sync)
        self.grad_buckets = None     # PyNative: FSDP reduce-scatters bucketed per unit (gradient_sync adds them)
        if self.world > 1:
            log.info("parallel layout: %s; rank %d reads data-parallel slice %d of %d", dims.describe(), self.rank,
                     self.dp_rank, self.dp)

    @property
    def enabled(self) -> bool:
        """Several ranks (for messages and file names; the training path does not depend on it)."""
        return self.world > 1

    @property
    def may_retry_step(self) -> bool:
        """Whether a failed first compiled step may be retried in PyNative. Not with several ranks: a
        rank that retried would issue its collectives out of step with the others (the error ends
        the job instead, and mf launch shows it)."""
        return self.world == 1

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        mp.barrier(self.mesh["world"])

    def graph_mode_blocker(self) -> str | None:
        return mp.graph_mode_blocker(self.dims) if self.enabled else None

    def options(self, recompute, n_layers: int = 0) -> mf_models.ParallelOptions:
        """The model plan's options: this run's layout (whose knobs with nothing to act on here
        already hold their defaults) and the Trainer's recompute hooks."""
        from mf_trainer.recompute import recompute_comm_selection

        comm = recompute_comm_selection(self.cfg.recompute_comm, n_layers) if self.dims.tp_enabled else None
        return mf_models.ParallelOptions(self.layout, recompute=recompute, recompute_comm=comm)

    def parallelize(self, model, recompute) -> None:
        """The model's own plan (the identity on one rank, where only the recompute callback acts)."""
        try:
            mf_models.parallelize_model(model, self.mesh, self.options(recompute, len(model.layers)))
        except (mp.ParallelConfigError, mf_models.ModelConfigError) as exc:
            raise TrainerConfigError(str(exc).strip().splitlines()[0]) from None
        # The per-parameter gradient all-reduces (tp-replicated weights, HSDP/DDP replicas) are left
        # to the step, which makes one per group (`gradient_sync`). Before the prefetcher: it
        # rebuilds the leaves it touches.
        if self.enabled:
            self.deferred_syncs = mp.defer_gradient_syncs(model)
            if self.deferred_syncs.count:
                log.info("gradient all-reduces of %d parameters left to the step: one per group (%s)",
                         self.deferred_syncs.count, ", ".join(self.deferred_syncs.groups))
        # In PyNative, FSDP gathers one unit run ahead, each run as one collective: asynchronous
        # devices overlap the gathers with compute, and every device makes fewer collective calls.
        if self.enabled and mp.gather_prefetch_pays_off(ms.get_context("mode")):
            self.prefetcher = mp.enable_gather_prefetch(model)
            # ... and the reduce-scatters travel one per unit too (not under the pipeline executor,
            # which runs deferred weight gradients through the pipelines on its own schedule).
            if self.dims.pp == 1:
                self.grad_buckets = mp.enable_gradient_buckets(model)

    def gradient_sync(self, params) -> nn.Cell | None:
        """What the step applies to the gradients (aligned with `params`) before using them: in
        PyNative the FSDP shard gradients reduce-scattered per unit bucket, then the bucketed
        all-reduces `parallelize` deferred; None when there is nothing (one rank)."""
        deferred = self.deferred_syncs
        sync = deferred.cell(params) if deferred is not None and deferred.count else None
        buckets = self.grad_buckets.cell(params) if self.grad_buckets is not None else None
        if buckets is None:
            return sync
        return _Then(buckets, sync) if sync is not None else buckets

    def clip(self, model, params, max_norm: float) -> nn.Cell:
        return mp.GlobalNormClip(model, params, self.mesh, max_norm)

    def cross_entropy(self) -> nn.Cell | None:
        """The vocab-parallel loss when logits are split along the vocabulary (tp > 1), else None."""
        return mp.VocabParallelCrossEntropy(self.mesh["tp"]) if self.dims.tp_enabled else None

    def linear_cross_entropy(self) -> nn.Cell:
        """The loss fused with the output projection (`mf_parallel.LinearCrossEntropy`), vocab-
        parallel over the tp group when tensor parallelism splits the projection."""
        return mp.LinearCrossEntropy(self.mesh["tp"] if self.dims.tp_enabled else None)

    def argmax(self) -> nn.Cell | None:
        """The vocab-parallel argmax (evaluation's token accuracy) when tp splits the logits, else None."""
        return mp.VocabParallelArgmax(self.mesh["tp"]) if self.dims.tp_enabled else None

    def sequence_sum(self, values: np.ndarray) -> np.ndarray:
        """`values` (float64 sums over this rank's tokens) added over the context-parallel group:
        a cp rank holds only its chunks of every sequence. The identity without cp."""
        if self.dims.cp == 1:
            return values
        if self._cp_sum is None:
            self._cp_sum = mp.AllReduce(self.mesh["cp"])
        return self._cp_sum(Tensor(np.asarray(values, np.float32))).asnumpy().astype(np.float64)

    def shard_sequence(self, micro_batch: dict) -> dict:
        """This rank's part of a micro-batch: under context parallelism its zigzag chunks of every
        column (mf_parallel.slice_for_context_parallel), else the micro-batch itself."""
        if self.dims.cp == 1:
            return micro_batch
        try:
            return mp.slice_for_context_parallel(micro_batch, self.dims.cp, self.cp_rank)
        except mp.ParallelConfigError as exc:
            raise TrainerConfigError(str(exc)) from None

    # ---- per-step host collectives (one tiny all-reduce each; compiled once in GRAPH_MODE) ----
    def global_tokens(self, local_tokens: float) -> float:
        """Loss-mask tokens of the global batch (exact: integer counts below 2^24 in float32)."""
        if self.loss_ranks == 1:
            return local_tokens
        return float(self.dp_sum(Tensor(np.array([local_tokens], np.float32))).asnumpy()[0])

    def global_loss(self, local_loss: float) -> float:
        """The step's loss: every data-parallel rank's share added up (divided back when scaled)."""
        if self.loss_ranks == 1:
            return local_loss
        total = float(self.dp_sum(Tensor(np.array([local_loss], np.float32))).asnumpy()[0])
        return total / self.loss_scale

    # ---- sharded state (checkpoints) -------------------------------------------------------
    def layouts(self, model) -> dict:
        return mp.param_layouts(model, self.mesh)

    def full_state(self, model) -> dict[str, np.ndarray]:
        """Every parameter as its full array, on every rank (collective)."""
        return mp.gather_full_state(model, self.mesh)

    def one_process_model(self, model, rebuild):
        """The model as one process would hold it, for generation: `model` itself on one rank (the
        plan is the identity there); else every rank gathers the full weights (a collective) and
        rank 0 gets `rebuild(full_state)`, the others None."""
        if self.world == 1:
            return model
        full = self.full_state(model)
        return rebuild(full) if self.is_rank0 else None

    def note_rank_values(self, step: int, metrics: dict, keys=("local_loss", "device_loss", "device_norm")) -> None:
        """Ranks other than 0 write no metrics file: their own values go to their log."""
        shown = [k for k in keys if k in metrics]
        if not self.is_rank0 and shown:
            log.info("rank %d step %d: %s", self.rank, step, ", ".join(f"{k} {metrics[k]:.6g}" for k in shown))


class _Then(nn.Cell):
    def __init__(self, first: nn.Cell, second: nn.Cell) -> None:
        super().__init__()
        self.first = first
        self.second = second

    def construct(self, grads):
        return self.second(self.first(grads))


def comm_metrics() -> dict:
    """This step's communication volume (mf-parallel's counter), then reset for the next step."""
    stats = mp.comm_stats()
    snap = stats.snapshot()
    stats.reset()
    payload = sum(v["payload_bytes"] for v in snap.values())
    issued = sum(v["issued_bytes"] for v in snap.values())
    return {"comm_bytes": payload, "comm_issued_bytes": issued, "comm_calls": sum(v["calls"] for v in snap.values()),
            "comm": snap}


class ShardedState:
    """Checkpoint state of the model and optimizer as mf-ckpt `ShardedTensor`s whose blocks, global
    shapes, offsets and replica ids come from mf-parallel's `param_layouts` (on one rank: the whole
    tensor at offset 0). An optimizer moment (`exp_avg.<name>`, `exp_avg_sq.<name>`, `momentum.<name>`) has its
    parameter's layout. `held`: the parameter names a checkpoint holds (every one, or a LoRA
    fine-tune's adapters): the filter that makes fine-tuning a choice of state, not a code path."""

    def __init__(self, ctx: ParallelContext, model, optimizer, held: set[str] | None = None):
        self.model = model
        self.optimizer = optimizer
        layouts = ctx.layouts(model)
        self.params = {name: p for name, p in model.parameters_and_names() if held is None or name in held}
        self.layouts = {name: layouts[name] for name in self.params}
        name_of = {id(p): name for name, p in model.parameters_and_names()}
        self.moment_layouts = {}
        for key, param in optimizer.moment_owners():   # AdamW's exp_avg/exp_avg_sq, Muon's momentum too
            self.moment_layouts[key] = layouts[name_of[id(param)]]

    @staticmethod
    def _sharded(arrays: dict, layouts: dict) -> dict:
        import mf_ckpt

        return {key: mf_ckpt.ShardedTensor(layouts[key].to_block(np.asarray(value)), layouts[key].global_shape,
                                           layouts[key].offset, layouts[key].replica_id)
                for key, value in arrays.items()}

    @staticmethod
    def _destinations(layouts: dict) -> dict:
        import mf_ckpt

        return {key: mf_ckpt.ShardedTensor(np.zeros(lay.shape, np.float32), lay.global_shape, lay.offset,
                                           lay.replica_id) for key, lay in layouts.items()}

    def model_state(self) -> dict:
        return self._sharded({name: p.asnumpy() for name, p in self.params.items()}, self.layouts)

    def optimizer_state(self) -> dict:
        moments = {k: v for k, v in self.optimizer.state_dict().items() if k != "step"}
        return self._sharded(moments, self.moment_layouts)

    def model_destinations(self) -> dict:
        return self._destinations(self.layouts)

    def optimizer_destinations(self) -> dict:
        return self._destinations(self.moment_layouts)

    def load_model(self, destinations: dict) -> None:
        """Set the held parameters from loaded blocks (mf-ckpt checked names and global shapes)."""
        for name, param in self.params.items():
            block = self.layouts[name].from_block(np.asarray(destinations[name].data, np.float32))
            param.set_data(Tensor(block, param.dtype))

    def moments(self, destinations: dict) -> dict:
        """The loaded moment blocks as arrays shaped like the stored Parameters (FSDP padding zero)."""
        return {key: self.moment_layouts[key].from_block(dest.data) for key, dest in destinations.items()}
