"""Expert balancing: the auxiliary balance losses, DeepSeek's aux-loss-free bias update, and the
routing metrics of a training step.

Balance losses, from the per-layer, per-sequence statistics `MoE` returns (counts c[l, b, e] of
assignments, sums p[l, b, e] of the scores over a sequence's S tokens; T = B*S, k = top-k, E experts,
L MoE layers):

- "sequence": DeepSeek-V3's sequence-wise balance loss (paper eq. 17-20; `aux_loss_alpha`,
  `seq_aux: true`), summed over layers as DeepSeek's MoE gates add theirs:
      alpha * sum_l mean_b sum_e  (c[l,b,e] * E / (S k)) * (p[l,b,e] / S)
- "batch": the same over the whole batch (`seq_aux: false`, DeepSeek's MoEGate otherwise):
      alpha * sum_l sum_e  (sum_b c[l,b,e] * E / (T k)) * (sum_b p[l,b,e] / T)
- "switch": transformers' `load_balancing_loss_func` (Mixtral, Qwen3-MoE with
  `output_router_logits: true`, weighted by `router_aux_loss_coef`), which pools every MoE layer's
  tokens before taking the product (it concatenates the layers' router logits):
      coef * E * sum_e  (sum_lb c[l,b,e] / (L T)) * (sum_lb p[l,b,e] / (L T))

Each is the value for one forward (one micro-batch). The counts are not differentiated; the
gradient reaches the gates through the score sums.

Sequences split over ranks (sequence parallelism under tp, context parallelism): each loss is
linear in the score sums p, so a rank holding part of every sequence computes its share from the
whole sequences' counts c (summed over the ranks holding pieces of them) and its own tokens' sums;
the shares add up to the loss, and each rank's share differentiates its own tokens' scores, as the
one-process loss does. `WholeSequences` is the model's view of that layout: whole sequences here;
a parallel plan that splits them replaces it (`mf_models.common.parallel.SplitSequences`).

Aux-loss-free balancing (DeepSeek-V3 section 2.1.2): after each optimizer step, with the step's
tokens per expert `load` of a layer, `expert_bias += rate * sign(mean(load) - load)`. The bias
only moves the selection (common/router.py). `update_expert_bias` does it from the loads a
training forward returns (summed over micro-batches and data-parallel ranks by the caller).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from mindspore import Tensor, nn, ops

from ..errors import ModelConfigError

BALANCE_KINDS = ("none", "sequence", "batch", "switch")


@dataclass(frozen=True)
class BalanceSpec:
    """Which balance loss a model trains with, and its weight (kind "none": no loss)."""

    kind: str = "none"
    coef: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in BALANCE_KINDS:
            raise ValueError(f"BalanceSpec.kind: {self.kind!r} is not one of {BALANCE_KINDS}")

    @property
    def active(self) -> bool:
        return self.kind != "none"


class WholeSequences(nn.Cell):
    """How a forward's sequences lie over ranks, for the balance loss: each rank holds whole
    sequences. `counts` [L, B, E] are then the whole sequences' counts, and the model's input length
    is the sequence length (`seq_parts` = 1). See the module docstring for split sequences."""

    seq_parts = 1

    def construct(self, counts):
        return counts


def balance_loss(spec: BalanceSpec, num_experts: int, top_k: int, seq_len: int, counts, sums):
    """The loss `spec` names from counts / sums [L, B, E] of sequences of `seq_len` tokens
    (graph-compatible: the kind is a Python constant). Kind "none" is 0. With `counts` of whole
    sequences and `sums` of a rank's part of them, this rank's share of the loss."""
    tokens = counts.shape[1] * seq_len
    if spec.kind == "sequence":
        return sequence_balance_loss(spec.coef, num_experts, top_k, seq_len, counts, sums)
    if spec.kind == "batch":
        return batch_balance_loss(spec.coef, num_experts, top_k, tokens, counts, sums)
    if spec.kind == "switch":
        return switch_balance_loss(spec.coef, num_experts, tokens, counts, sums)
    return ops.zeros((), counts.dtype)


def sequence_balance_loss(alpha: float, num_experts: int, top_k: int, seq_len: int, counts, sums):
    """DeepSeek's sequence-wise loss, summed over layers; counts/sums [L, B, E]."""
    f = counts * (num_experts / (seq_len * top_k))
    p = sums / seq_len
    return (f * p).sum(-1).mean(-1).sum() * alpha


def batch_balance_loss(alpha: float, num_experts: int, top_k: int, tokens: int, counts, sums):
    """DeepSeek's batch-wise loss (seq_aux false), summed over layers; `tokens` = B*S."""
    f = counts.sum(1) * (num_experts / (tokens * top_k))
    p = sums.sum(1) / tokens
    return (f * p).sum() * alpha


def switch_balance_loss(coef: float, num_experts: int, tokens: int, counts, sums):
    """transformers' load_balancing_loss_func over every MoE layer's tokens pooled; `tokens` = B*S."""
    pooled = counts.shape[0] * tokens
    f = counts.sum(0).sum(0) / pooled
    p = sums.sum(0).sum(0) / pooled
    return (f * p).sum() * (coef * num_experts)


# ----------------------------------------------------------------------------- host side
def _moe_routers(model) -> list[tuple[int, object]]:
    """(row id, router) of every routed MoE layer: the decoder's by layer index, then the blocks of
    the multi-token-prediction modules numbered after them (`CausalLM.moe_layer_ids`)."""
    routers = [(i, layer.moe.router) for i, layer in enumerate(model.layers) if getattr(layer, "moe_enabled", False)]
    n = len(model.layers)
    routers += [(n + k, module.block.moe.router) for k, module in enumerate(getattr(model, "mtp", ()))
                if module.moe_enabled]
    return routers


def bias_update(load: np.ndarray, rate: float) -> np.ndarray:
    """DeepSeek's rule for loads [..., E]: rate * sign(mean(load) - load) (float32)."""
    load = np.asarray(load, np.float64)
    return (rate * np.sign(load.mean(-1, keepdims=True) - load)).astype(np.float32)


def update_expert_bias(model, tokens_per_expert, *, rate: float | None = None, mesh=None) -> np.ndarray:
    """Aux-loss-free balancing after an optimizer step: every MoE layer's `expert_bias` +=
    `rate * sign(mean(load) - load)`, `tokens_per_expert` [num MoE layers, E] being the step's loads
    (from `forward_train`, summed over micro-batches and ranks). `rate` defaults to the model's
    `moe_router_bias_update_rate`; 0 does nothing. With `mesh` (a parallelised model) each rank
    adds its own block of the update to its stored shard. Returns the update [L, E]."""
    routers = _moe_routers(model)
    load = np.asarray(tokens_per_expert.asnumpy() if isinstance(tokens_per_expert, Tensor) else tokens_per_expert)
    if load.shape != (len(routers), routers[0][1].num_experts if routers else 0):
        raise ModelConfigError(f"update_expert_bias: tokens_per_expert has shape {list(load.shape)}, the model has "
                               f"{len(routers)} MoE layers of {routers[0][1].num_experts if routers else 0} experts")
    if any(r.expert_bias is None for _, r in routers):
        raise ModelConfigError(f"update_expert_bias: {type(model).__name__} routers have no expert bias "
                               f"(aux-loss-free balancing is DeepSeek-V3's)")
    if rate is None:
        rate = float(getattr(model.args, "moe_router_bias_update_rate", 0.0))
    delta = bias_update(load, rate)
    if rate == 0:
        return delta
    layouts = None
    if mesh is not None:
        import mf_parallel as mp

        layouts = mp.param_layouts(model, mesh)
    names = {id(p): n for n, p in model.parameters_and_names()}
    for (_, router), step in zip(routers, delta):
        param = router.expert_bias
        local = step
        if layouts is not None:
            layout = layouts[names[id(param)]]
            start = layout.offset[0]
            local = layout.from_block(step[start:start + layout.shape[0]])
        if tuple(local.shape) != tuple(param.shape):
            raise ModelConfigError(f"update_expert_bias: {names[id(param)]} is stored as {list(param.shape)} "
                                   f"(sharded?); pass the model's mesh")
        param.set_data(Tensor(param.asnumpy() + local, param.dtype))
    return delta


@dataclass(frozen=True)
class RoutingStats:
    """Routing of one training step (or forward) per MoE layer, host side (numpy).

    tokens_per_expert [L, E] assignments each expert received; dropped [L] (0: dispatch is
    dropless) and padded [L] (rows computed without an assignment) per layer; layers: the decoder
    layer index of each row, then num_hidden_layers + k for the MoE block of multi-token-prediction
    module k (`mtp_from`: the first such id, None without MTP). Metrics name a decoder row
    `moe/layer{i}/...` and an MTP row `moe/mtp{k}/...` (MindFormers' "block": "mtp").
    """

    layers: tuple[int, ...]
    tokens_per_expert: np.ndarray
    dropped: np.ndarray
    padded: np.ndarray
    mtp_from: int | None = None

    @classmethod
    def from_outputs(cls, model, tokens_per_expert, dispatch_counts) -> RoutingStats:
        load = np.asarray(tokens_per_expert.asnumpy() if isinstance(tokens_per_expert, Tensor) else tokens_per_expert)
        counts = np.asarray(dispatch_counts.asnumpy() if isinstance(dispatch_counts, Tensor) else dispatch_counts)
        layers = tuple(i for i, _ in _moe_routers(model))
        mtp_from = len(model.layers) if getattr(model, "mtp", None) is not None else None
        return cls(layers, load.astype(np.float64), counts[:, 0].astype(np.float64), counts[:, 1].astype(np.float64),
                   mtp_from)

    def __add__(self, other: RoutingStats) -> RoutingStats:
        """Sum of two micro-batches' (or ranks') statistics."""
        if self.layers != other.layers:
            raise ValueError("RoutingStats of different models cannot be added")
        return RoutingStats(self.layers, self.tokens_per_expert + other.tokens_per_expert,
                            self.dropped + other.dropped, self.padded + other.padded, self.mtp_from)

    def imbalance(self) -> np.ndarray:
        """max / mean tokens per expert, per layer (1.0 = perfectly balanced)."""
        mean = self.tokens_per_expert.mean(-1)
        return np.where(mean > 0, self.tokens_per_expert.max(-1) / np.maximum(mean, 1e-30), 1.0)

    def block_of(self, layer: int) -> tuple[str, int]:
        """("decoder", layer index) or ("mtp", module index) of a row id."""
        if self.mtp_from is not None and layer >= self.mtp_from:
            return "mtp", layer - self.mtp_from
        return "decoder", layer

    def metrics(self, layers: Sequence[int] | None = None) -> dict[str, float | list[float]]:
        """Flat metrics: moe/layer{i}/{imbalance,dropped,padded,tokens_per_expert} of the decoder's
        MoE layers (those in `layers`, decoder layer ids, when given), moe/mtp{k}/... of every MTP
        module's MoE block (+ overall max)."""
        out: dict[str, float | list[float]] = {}
        imbalance = self.imbalance()
        for row, layer in enumerate(self.layers):
            block, index = self.block_of(layer)
            if block == "decoder" and layers is not None and layer not in layers:
                continue
            prefix = f"moe/layer{index}/" if block == "decoder" else f"moe/mtp{index}/"
            out[prefix + "tokens_per_expert"] = self.tokens_per_expert[row].tolist()
            out[prefix + "imbalance"] = float(imbalance[row])
            out[prefix + "dropped"] = float(self.dropped[row])
            out[prefix + "padded"] = float(self.padded[row])
        if len(self.layers):
            out["moe/max_imbalance"] = float(imbalance.max())
            out["moe/dropped"] = float(self.dropped.sum())
        return out
