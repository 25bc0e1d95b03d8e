"""Masked next-token cross entropy, summed: the caller scales by 1 / (tokens in the global batch).

Why not a library loss: `mint.nn.functional.cross_entropy` and `mint`'s `log_softmax` have no CPU
kernel, `ops.cross_entropy` is ~30x slower than the sparse kernel and much heavier, and the sparse
kernel `SparseSoftmaxCrossEntropyWithLogits` only returns the batch mean, which cannot carry a
`loss_mask`. So the per-token loss is the label's entry of the fused `ops.LogSoftmax` kernel
(numerically stable, one kernel on CPU and Ascend):

    loss_i = -log_softmax(z_i)[label_i]

Its backward is where the time went: autodiff differentiates the gather and then runs
`LogSoftmaxGrad` over the whole [N, V] logits, 21% of the 20M llama's step on CPU. The gradient
has a closed form, d loss_i / d z_i = softmax(z_i) - onehot(label_i), which is exactly what the
sparse kernel computes in its gradient mode (divided by N). `TokenCrossEntropy` therefore keeps
the LogSoftmax forward and takes its backward from that kernel, scaled per token by the incoming
gradient (the mask and 1 / tokens): on 1024 x 32000 logits, forward + backward 2.8x faster than
autodiff's, same loss, gradients within 1.4e-8 (benchmarks/train_bench.py quotes the step).

`sum(loss * mask) * inv_tokens`, with `inv_tokens = 1 / sum(mask over the global batch)` computed
on the host before the step, gives the same loss and gradients whether the global batch is
processed at once or accumulated over micro-batches (each micro-batch contributes its share of one
sum; nobody averages averages).

The training loss does not even build the logits: `MaskedLMLoss` hands the model's final hidden
states and its output projection's terms (`CausalLM.head_terms`) to mf-parallel's
`LinearCrossEntropy`, which projects, takes the loss and makes the gradients chunk by chunk (the
same two kernels per chunk as `TokenCrossEntropy`), so the [tokens, V] logits and their gradient
never exist whole: on the 20M llama of benchmarks/train_bench.py (1024 x 32000 logits) the step's
peak holds one 256-token chunk's instead of five logits-sized buffers. The sums differ from the
unfused loss only in order (chunk by chunk).
"""

from __future__ import annotations

import logging

import mindspore as ms
from mindspore import nn, ops

import mf_parallel as mp

log = logging.getLogger("mf_trainer")

_LOG_SOFTMAX = ops.LogSoftmax(axis=-1)


class TokenCrossEntropy(nn.Cell):
    """Per-token loss [N] from logits [N, V] (float32) and int32 labels [N] in [0, V)."""

    def __init__(self):
        super().__init__()
        self.softmax_minus_onehot = ops.SparseSoftmaxCrossEntropyWithLogits(is_grad=True)

    def construct(self, logits, labels):
        return -ops.gather_elements(_LOG_SOFTMAX(logits), 1, labels.reshape(-1, 1)).reshape(-1)

    def bprop(self, logits, labels, out, dout):
        # The kernel returns (softmax - onehot) / N; undo its mean and apply each token's weight.
        rows = logits.shape[0]
        grad = self.softmax_minus_onehot(logits, labels) * (dout * rows).reshape(-1, 1)
        return grad, ops.zeros_like(labels)


_TOKEN_CROSS_ENTROPY = TokenCrossEntropy()


def token_cross_entropy(logits, labels):
    """Per-token loss [N] from logits [N, V] (float32) and int32 labels [N]."""
    return _TOKEN_CROSS_ENTROPY(logits, labels)


def head_fusion_problem(model) -> str | None:
    """Why `model`'s output projection cannot be fused with the loss (None when it can)."""
    if not callable(getattr(model, "head_terms", None)) or not callable(getattr(model, "forward_train_hidden", None)):
        return f"{type(model).__name__} has no head_terms / forward_train_hidden"
    return model.head_terms_problem()


class MaskedLMLoss(nn.Cell):
    """sum(loss * loss_mask) * inv_tokens of `model(*model_inputs) -> logits [B, S, V]`.

    `model_inputs` is (input_ids[, position_ids[, attention_mask]]), the columns the data has.

    By default the output projection is fused with the loss (`head_loss`, mf-parallel's
    `LinearCrossEntropy`: vocab-parallel under tensor parallelism, ParallelContext.
    linear_cross_entropy) for a model that offers it (`CausalLM.head_terms`); `fuse_head=False`, or
    a model without it, takes the logits and `cross_entropy` (per-token loss of logits and labels;
    e.g. mf-parallel's vocab-parallel loss when tensor parallelism leaves the logits split along
    the vocabulary; default `TokenCrossEntropy`).
    """

    def __init__(self, model, cross_entropy: nn.Cell | None = None, head_loss: nn.Cell | None = None,
                 fuse_head: bool = True):
        super().__init__(auto_prefix=False)
        self.model = model
        self.vocab_parallel = cross_entropy is not None
        self.cross_entropy = cross_entropy if cross_entropy is not None else TokenCrossEntropy()
        problem = head_fusion_problem(model) if fuse_head else "fuse_head is False"
        if problem is None and head_loss is None and cross_entropy is not None:
            problem = "a logits cross_entropy was given without a head_loss"
        self.fused = problem is None
        if self.fused:
            self.head_loss = head_loss if head_loss is not None else mp.LinearCrossEntropy()
            # Which head weights need gradients, read now (frozen ones, e.g. under LoRA, skip a GEMM).
            self.head_trained = tuple(model.head_trained())
        elif fuse_head:
            log.info("loss: the output projection is not fused with the loss (%s); the whole logits are built", problem)

    def construct(self, labels, loss_mask, inv_tokens, *model_inputs):
        if self.fused:
            return self.fused_loss(self.model.forward_train_hidden(*model_inputs)[0], labels, loss_mask, inv_tokens)
        return self.masked_loss(self.model(*model_inputs), labels, loss_mask, inv_tokens)

    def fused_loss(self, hidden, labels, loss_mask, inv_tokens):
        """sum(per-token loss * loss_mask) * inv_tokens from the final hidden states [B, S, H]."""
        return self.head_loss(self.model.head_terms(hidden), labels, loss_mask, self.head_trained) * inv_tokens

    def masked_loss(self, logits, labels, loss_mask, inv_tokens):
        """sum(per-token loss * loss_mask) * inv_tokens of logits [B, S, V] (or vocab shards)."""
        if self.vocab_parallel:
            per_token = self.cross_entropy(logits, labels).reshape(-1)
        else:
            vocab = logits.shape[-1]
            per_token = self.cross_entropy(logits.reshape(-1, vocab).astype(ms.float32), labels.reshape(-1))
        return (per_token * loss_mask.reshape(-1)).sum() * inv_tokens
