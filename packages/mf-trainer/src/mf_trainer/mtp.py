"""Multi-token prediction (MTP) training: DeepSeek-V3's extra objective (mf_models common/mtp.py),
as Megatron-Core weighs it.

A model built with `num_nextn_predict_layers` = D MTP modules (DeepSeek-V3, GLM-4.5) trains

    loss = LM loss  +  balance loss (MoE)  +  mtp_loss_scaling_factor / D * sum_k L_k

where L_k, the loss of depth k, is the masked cross entropy of module k's logits against the labels
shifted left k times (label of token i + k + 1 at position i), the loss mask shifted with them
(zero where the shifted labels run past the sequence), over the global batch's count of those
tokens: like the LM loss, sum(token loss x mask) / tokens of the GLOBAL batch, so the value and
the gradients do not depend on how the batch is split over ranks and micro-batches. (Megatron-Core
divides by each micro-batch's own count unless `calculate_per_token_loss`; this is its per-token
form.) The step feeds 1 / tokens of each depth beside the LM loss's (`mtp_inverse_tokens`).

Reported per step (metrics.jsonl, TensorBoard `train/mtp/...`, the console line): `mtp/loss` (the
weighted sum added to the objective) and `mtp/loss_k` for k = 1..D (each depth's own loss), with
`loss` the whole objective. The MTP blocks' MoE tokens are counted by the MoE monitor (rows after
the decoder's: `moe/mtp{k}/...`) and move their own expert biases.
"""

from __future__ import annotations

import numpy as np
from mindspore import ops

from mf_models import shift_left
from mf_trainer.loss import MaskedLMLoss

PREFIX = "mtp/"


class MTPLMLoss(MaskedLMLoss):
    """(labels, loss_mask, inv_tokens [1 + D], *model_inputs) -> (objective, weighted aux loss,
    tokens_per_expert, dispatch_counts, the depths' losses [D]); only the objective is
    differentiated. `inv_tokens[0]` is 1 / (the LM loss's global tokens), `inv_tokens[k]` depth k's."""

    has_aux = True

    def __init__(self, model, cross_entropy=None, aux_weight: float = 1.0, head_loss=None, fuse_head: bool = True):
        super().__init__(model, cross_entropy, head_loss, fuse_head)
        self.aux_weight = float(aux_weight)
        self.mtp_depth = int(model.mtp_depth)
        self.mtp_weight = float(model.args.mtp_loss_scaling_factor) / self.mtp_depth

    def hidden_loss(self, hidden, labels, loss_mask, inv_tokens):
        """The masked loss of final-norm hidden states: through the projection fused with the loss
        (MaskedLMLoss.fused_loss: the model's head, which the MTP depths share), else their logits."""
        if self.fused:
            return self.fused_loss(hidden, labels, loss_mask, inv_tokens)
        return self.masked_loss(self.model.head(hidden), labels, loss_mask, inv_tokens)

    def construct(self, labels, loss_mask, inv_tokens, *model_inputs):
        h, mtp_h, aux, load, counts = self.model.forward_train_mtp(*model_inputs)
        objective = self.hidden_loss(h, labels, loss_mask, inv_tokens[0])
        losses = ()
        for k in range(self.mtp_depth):
            labels = shift_left(labels)
            loss_mask = shift_left(loss_mask)
            losses = losses + (self.hidden_loss(mtp_h[k], labels, loss_mask, inv_tokens[k + 1]),)
        depth_losses = ops.stack(losses)
        aux = aux * self.aux_weight
        return objective + depth_losses.sum() * self.mtp_weight + aux, aux, load, counts, depth_losses


def inverse_tokens(micro_batches: list[dict], global_tokens, loss_scale: int, depth: int) -> tuple[np.ndarray, float]:
    """([1 + D] loss_scale / global tokens of the LM loss and each depth, the LM's global tokens)."""
    tokens = global_tokens(float(sum(float(mb["loss_mask"].sum()) for mb in micro_batches)))
    depths = [global_tokens(c) for c in depth_token_counts(micro_batches, depth)]
    return mtp_inverse_tokens(tokens, depths, loss_scale), tokens


class PipelineMTPLoss:
    """The pipeline's last-stage loss of a model with MTP (mf_trainer/pipeline_step.py): the last
    chunk returns the model's output and each depth's (hidden states when the loss is fused with
    the projection, else logits: `lm_loss` takes either); the loss is MTPLMLoss's without the balance
    loss (a side loss of the chunks). Each micro-batch's depth losses are kept by the micro-batch
    (a backward that recomputes the forward replaces them, never adds them twice) for the step's
    extras."""

    def __init__(self, lm_loss, depth: int, weight: float) -> None:
        self.lm_loss = lm_loss           # (output, labels, mask, inv) -> the masked loss
        self.depth = depth
        self.weight = weight
        self.inv_tokens = None           # [1 + D], set before each step
        self.depth_losses: dict[int, object] = {}

    def __call__(self, out, mb):
        labels, mask = mb["labels"], mb["loss_mask"]
        total = self.lm_loss(out[0], labels, mask, self.inv_tokens[0])
        losses = []
        for k in range(self.depth):
            labels, mask = shift_left(labels), shift_left(mask)
            losses.append(self.lm_loss(out[k + 1], labels, mask, self.inv_tokens[k + 1]))
        self.depth_losses[id(mb)] = [float(x.asnumpy()) for x in losses]
        stacked = ops.stack(losses)
        return total + stacked.sum() * self.weight

    def take(self) -> np.ndarray:
        """The step's depth losses (this rank's share, summed over micro-batches), then forget them."""
        out = np.zeros(self.depth, np.float32)
        for values in self.depth_losses.values():
            out += np.asarray(values, np.float32)
        self.depth_losses = {}
        return out


def depth_token_counts(micro_batches: list[dict], depth: int) -> list[float]:
    """This rank's loss-mask tokens of each depth 1..D: depth k keeps the mask of positions >= k."""
    return [float(sum(float(np.asarray(mb["loss_mask"])[:, k:].sum()) for mb in micro_batches))
            for k in range(1, depth + 1)]


def mtp_inverse_tokens(tokens: float, depth_tokens: list[float], loss_scale: int) -> np.ndarray:
    """[1 + D] float32: loss_scale / (global tokens) of the LM loss and of each depth (inf for none:
    a batch with no token to predict is non-finite, and the step is skipped as for the LM loss)."""
    return np.array([loss_scale / t if t > 0 else np.inf for t in (tokens, *depth_tokens)], np.float32)


class MTPTraining:
    """Host side of MTP for one Trainer (inactive without MTP modules): the step's metrics."""

    def __init__(self, model, parallel):
        self.depth = int(getattr(model, "mtp_depth", 0))
        self.weight = float(model.args.mtp_loss_scaling_factor) / self.depth if self.depth else 0.0
        self.parallel = parallel
        self._world_sum = None
        if self.depth and parallel.world > 1:
            import mf_parallel as mp

            self._world_sum = mp.AllReduce(parallel.mesh["world"])

    @property
    def active(self) -> bool:
        return self.depth > 0

    def after_step(self, done) -> dict:
        """`mtp/loss` and `mtp/loss_k` of the step. Each rank's depth losses are its share (its
        data-parallel slice's tokens over the global count, x loss_scale); tensor-parallel ranks
        hold the same share, and under pipeline parallelism only the last stage holds any: one
        all-reduce over the world, divided by tp and loss_scale."""
        if not self.active:
            return {}
        losses = np.asarray(done.extras[3], np.float64).reshape(-1)
        par = self.parallel
        if self._world_sum is not None:
            from mindspore import Tensor

            losses = self._world_sum(Tensor(losses.astype(np.float32))).asnumpy().astype(np.float64)
            losses = losses / par.dims.tp
        losses = losses / par.loss_scale
        metrics = {PREFIX + "loss": float(losses.sum() * self.weight)}
        metrics.update({f"{PREFIX}loss_{k + 1}": float(v) for k, v in enumerate(losses)})
        return metrics


def write_tensorboard(writer, metrics: dict, step: int) -> None:
    """The `mtp/` metrics as scalars `train/mtp/...`."""
    for key, value in metrics.items():
        if key.startswith(PREFIX) and isinstance(value, float) and np.isfinite(value):
            writer.add_scalar("train/" + key, value, step)
