"""MoE training: the balance loss in the objective, DeepSeek-V3's aux-loss-free expert-bias update
after each optimizer step, and the routing metrics (with `monitor.moe_monitor`).

The one training path uses it for every model with routed MoE layers (`args.moe_layer_ids()`):

* `MoELMLoss` is the training loss: `model.forward_train` gives the logits, the model's balance
  loss (already weighted by its own coefficient: `aux_loss_alpha` for DeepSeek-V3,
  `router_aux_loss_coef` with `output_router_logits: true` for Mixtral / Qwen3-MoE) and the
  routing counts. The objective is

      sum(token loss * mask) / global tokens  +  mean over the global batch's micro-batches of aux

  so each micro-batch's balance loss is weighted by `loss_scale / (accumulation * dp)` (the
  micro-batches of every data-parallel rank count once; `loss_scale` undoes FSDP's gradient mean).
  The balance loss is a per-micro-batch statistic, as in Megatron-Core; the sequence-wise one
  (DeepSeek's `seq_aux: true`) is a mean over sequences, so it does not depend on how the batch is
  split. Only the objective is differentiated; the routing counts come back beside it
  (`StepResult.extras`).
* `MoETraining.after_step` adds up the step's tokens per expert over micro-batches (in the step)
  and ranks (here: every rank routes its own tokens), then, if the step was applied, moves each
  MoE layer's `expert_bias` by `rate * sign(mean(load) - load)` (`mf_models.update_expert_bias`;
  `model.moe_router_bias_update_rate`, DeepSeek's 1e-3 by default, 0 switches it off). A skipped
  (non-finite) step updates nothing, the bias included. The bias is a model parameter: checkpoints
  hold it and a resumed run continues its trajectory.
* Metrics of every step (metrics.jsonl and TensorBoard under `moe/`): `moe/aux_loss` (the balance
  loss part of `loss`), `moe/max_imbalance` (max over layers of max/mean tokens per expert),
  `moe/dropped` (assignments dropped: 0, the dispatch is dropless) and `moe/padded` (rows the
  grouped matmul computed without an assignment). Every `save_tokens_per_expert_interval` steps
  (`monitor.moe_monitor`), per layer of `target_layers` (default: every MoE layer):
  `moe/layer{i}/tokens_per_expert` (a list; a TensorBoard histogram with one bucket per expert),
  `moe/layer{i}/imbalance`, `.../dropped`, `.../padded`.
"""

from __future__ import annotations

import numpy as np

from mf_trainer.loss import MaskedLMLoss

PREFIX = "moe/"


class MoELMLoss(MaskedLMLoss):
    """(labels, loss_mask, inv_tokens, *model_inputs) -> (objective, weighted aux loss,
    tokens_per_expert [L, E], dispatch_counts [L, 2]); only the objective is differentiated."""

    has_aux = True

    def __init__(self, model, cross_entropy=None, aux_weight: float = 1.0, head_loss=None, fuse_head: bool = True):
        super().__init__(model, cross_entropy, head_loss, fuse_head)
        self.aux_weight = float(aux_weight)

    def construct(self, labels, loss_mask, inv_tokens, *model_inputs):
        if self.fused:
            hidden, aux, load, counts = self.model.forward_train_hidden(*model_inputs)
            lm = self.fused_loss(hidden, labels, loss_mask, inv_tokens)
        else:
            logits, aux, load, counts = self.model.forward_train(*model_inputs)
            lm = self.masked_loss(logits, labels, loss_mask, inv_tokens)
        aux = aux * self.aux_weight
        return lm + aux, aux, load, counts


class MoETraining:
    """Host side of MoE training for one Trainer (inactive for dense models: no routed layer)."""

    def __init__(self, model, args, moe_monitor, parallel):
        self.model = model
        # the model's rows: its decoder's MoE layers, then its MTP modules' (mf_trainer/mtp.py)
        self.layers = list(model.moe_layer_ids())
        self.rate = float(args.expert_bias_rate())
        self.interval = moe_monitor.save_tokens_per_expert_interval
        targets = moe_monitor.target_layers
        # decoder layer ids, as MindFormers' monitor takes them: those without experts are left out
        # (the preflight's notice names them)
        self.targets = None if targets is None else [int(i) for i in targets if int(i) in self.layers]
        self.parallel = parallel
        self._world_sum = None
        if parallel.world > 1:
            import mf_parallel as mp

            self._world_sum = mp.AllReduce(parallel.mesh["world"])

    @property
    def active(self) -> bool:
        return bool(self.layers)

    def loss_cell(self, cross_entropy, accumulation: int, head_loss=None) -> MoELMLoss:
        par = self.parallel
        return MoELMLoss(self.model, cross_entropy, par.loss_scale / (accumulation * par.dp), head_loss)

    def _summed_over_ranks(self, aux: float, load: np.ndarray, counts: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """Every rank routes its own tokens (data-parallel slices, sequence shards) and holds its
        share of the balance loss (ranks splitting sequences compute shares: mf_models'
        `SplitSequences`): the step's routing and balance loss are sums over the world (the loss
        divided back by FSDP's `loss_scale`). One all-reduce of the concatenated values."""
        if self._world_sum is None:
            return aux, load, counts
        from mindspore import Tensor

        flat = np.concatenate([[aux], load.reshape(-1), counts.reshape(-1)]).astype(np.float32)
        total = self._world_sum(Tensor(flat)).asnumpy()
        return (float(total[0]) / self.parallel.loss_scale, total[1:1 + load.size].reshape(load.shape),
                total[1 + load.size:].reshape(counts.shape))

    def step_loss(self, done, routing: dict) -> float:
        """The step's loss. Each rank's `done.loss` is its language-model share plus its share of
        the balance loss; the language-model shares add up over the data-parallel ranks
        (`ParallelContext.global_loss`: tensor-parallel and pipeline ranks hold the same one), the
        balance-loss shares over every rank (tp ranks and pipeline stages hold different ones):
        `routing`'s total, from `after_step`."""
        par = self.parallel
        if not self.active:
            return par.global_loss(done.loss)
        return par.global_loss(done.loss - float(np.asarray(done.extras[0]))) + routing[PREFIX + "aux_loss"]

    def after_step(self, step: int, done) -> dict:
        """The expert-bias update (when `done.applied`) and this step's `moe/` metrics."""
        if not self.active:
            return {}
        import mf_models

        aux, load, counts = done.extras[:3]       # (an MTP loss cell adds its depths' losses after them)
        aux, load, counts = self._summed_over_ranks(float(np.asarray(aux)), np.asarray(load), np.asarray(counts))
        if done.applied and self.rate > 0:
            mf_models.update_expert_bias(self.model, load, rate=self.rate,
                                         mesh=self.parallel.mesh if self.parallel.world > 1 else None)
        stats = mf_models.RoutingStats.from_outputs(self.model, load, counts)
        imbalance = stats.imbalance()
        metrics = {PREFIX + "aux_loss": aux,
                   PREFIX + "max_imbalance": float(imbalance.max()),
                   PREFIX + "dropped": float(stats.dropped.sum()), PREFIX + "padded": float(stats.padded.sum())}
        if self.interval is not None and step % self.interval == 0:
            metrics.update(stats.metrics(self.targets))
        return metrics


def write_tensorboard(writer, metrics: dict, step: int) -> None:
    """The `moe/` metrics: scalars as scalars, tokens per expert as a histogram whose bucket e
    holds expert e's tokens."""
    for key, value in metrics.items():
        if not key.startswith(PREFIX):
            continue
        if isinstance(value, list):
            counts = np.asarray(value, np.float64)
            experts = np.arange(len(counts), dtype=np.float64)
            writer.add_histogram_raw(key, min=0.0, max=float(len(counts) - 1), num=float(counts.sum()),
                                     sum=float((experts * counts).sum()),
                                     sum_squares=float((experts ** 2 * counts).sum()),
                                     bucket_limits=(experts + 0.5).tolist(), bucket_counts=counts.tolist(),
                                     global_step=step)
        elif isinstance(value, (int, float)) and np.isfinite(value):
            writer.add_scalar(key, value, step)
