"""A tiny llama-shaped transformer with its own parallel plan, for parallel_bench.py.

It is written against mf-parallel alone (not mf-models), so the benchmark measures mf-parallel's
primitives on an architecture whose collective volumes it can count by hand. (The Trainer's
parity proof uses mf-models' real llama and its plan: tests-integration/dist.)

Embedding, pre-norm blocks (RMSNorm, causal multi-head attention with grouped key/value heads,
SwiGLU MLP), final norm, output projection. Attention reshapes with -1 heads, so the same code
runs on the local heads of a tensor-parallel rank. Biases on wq (column-parallel) and wo
(row-parallel) exercise both bias rules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, mint, nn, ops

import mf_parallel as mp


@dataclass(frozen=True)
class TinyArgs:
    vocab: int = 32
    dim: int = 16
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    hidden: int = 24
    seq: int = 8


def rms_norm_forward(cell, weight, x):
    return x * ops.rsqrt((x * x).mean(-1, keep_dims=True) + cell.eps) * weight


class RMSNorm(nn.Cell):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = Parameter(Tensor(np.ones(dim, np.float32)), name="weight")

    def construct(self, x):
        return rms_norm_forward(self, self.weight, x)


mp.register_param_forward(RMSNorm, ("weight",), rms_norm_forward)


class Attention(nn.Cell):
    def __init__(self, a: TinyArgs) -> None:
        super().__init__()
        self.head_dim = a.dim // a.n_heads
        self.wq = mint.nn.Linear(a.dim, a.n_heads * self.head_dim, bias=True)
        self.wk = mint.nn.Linear(a.dim, a.n_kv_heads * self.head_dim, bias=False)
        self.wv = mint.nn.Linear(a.dim, a.n_kv_heads * self.head_dim, bias=False)
        self.wo = mint.nn.Linear(a.n_heads * self.head_dim, a.dim, bias=True)
        self.rep = a.n_heads // a.n_kv_heads
        mask = np.triu(np.full((a.seq, a.seq), -1e9, np.float32), 1)
        self.mask = Tensor(mask)

    def construct(self, x):
        b, s, _ = x.shape
        q = self.wq(x).reshape(b, s, -1, self.head_dim).transpose(0, 2, 1, 3)
        k = self.wk(x).reshape(b, s, -1, self.head_dim).transpose(0, 2, 1, 3)
        v = self.wv(x).reshape(b, s, -1, self.head_dim).transpose(0, 2, 1, 3)
        if self.rep > 1:
            k = ops.repeat_interleave(k, self.rep, 1)
            v = ops.repeat_interleave(v, self.rep, 1)
        scores = mint.matmul(q, k.transpose(0, 1, 3, 2)) / math.sqrt(self.head_dim) + self.mask
        out = mint.matmul(mint.softmax(scores, -1), v).transpose(0, 2, 1, 3).reshape(b, s, -1)
        return self.wo(out)


class FeedForward(nn.Cell):
    def __init__(self, a: TinyArgs) -> None:
        super().__init__()
        self.w1 = mint.nn.Linear(a.dim, a.hidden, bias=False)
        self.w2 = mint.nn.Linear(a.hidden, a.dim, bias=False)
        self.w3 = mint.nn.Linear(a.dim, a.hidden, bias=False)

    def construct(self, x):
        return self.w2(mint.nn.functional.silu(self.w1(x)) * self.w3(x))


class Block(nn.Cell):
    def __init__(self, a: TinyArgs) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(a.dim)
        self.attention = Attention(a)
        self.ffn_norm = RMSNorm(a.dim)
        self.feed_forward = FeedForward(a)

    def construct(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Tiny(nn.Cell):
    def __init__(self, a: TinyArgs) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(a.vocab, a.dim)
        self.layers = nn.CellList([Block(a) for _ in range(a.n_layers)])
        self.norm = RMSNorm(a.dim)
        self.output = mint.nn.Linear(a.dim, a.vocab, bias=False)

    def construct(self, ids):
        return self.output(self.hidden(ids))

    def hidden(self, ids):
        """The final-norm hidden states (what the loss fused with the output projection takes)."""
        h = self.tok_embeddings(ids)
        for layer in self.layers:
            h = layer(h)
        return self.norm(h)


def build(a: TinyArgs, seed: int) -> Tiny:
    """Deterministic weights: every rank and the reference start identical."""
    model = Tiny(a)
    rng = np.random.default_rng(seed)
    for _, p in model.parameters_and_names():
        scale = 0.3 if p.ndim > 1 else 0.1
        base = 1.0 if p.name.endswith("norm.weight") else 0.0
        p.set_data(Tensor((base + scale * rng.standard_normal(p.shape)).astype(np.float32)))
    return model


# ----------------------------------------------------------------------------- the plan
def tp_plan(a: TinyArgs) -> dict:
    plan = {"tok_embeddings": mp.VocabParallelEmbedding()}
    for i in range(a.n_layers):
        p = f"layers.{i}."
        plan.update({
            p + "attention_norm": mp.SequenceParallel(),
            p + "attention": mp.PrepareModuleInput(),
            p + "attention.wq": mp.ColwiseParallel(input_layout="gathered"),
            p + "attention.wk": mp.ColwiseParallel(input_layout="gathered"),
            p + "attention.wv": mp.ColwiseParallel(input_layout="gathered"),
            p + "attention.wo": mp.RowwiseParallel(),
            p + "ffn_norm": mp.SequenceParallel(),
            p + "feed_forward": mp.PrepareModuleInput(),
            p + "feed_forward.w1": mp.ColwiseParallel(input_layout="gathered"),
            p + "feed_forward.w3": mp.ColwiseParallel(input_layout="gathered"),
            p + "feed_forward.w2": mp.RowwiseParallel(),
        })
    plan["norm"] = mp.SequenceParallel()
    plan["output"] = mp.ColwiseParallel(input_layout="shard_seq")
    return plan


def parallelize(model: Tiny, a: TinyArgs, mesh, policy: str = "default", divide: bool = False) -> Tiny:
    """TP (+SP) first, then FSDP per block and at the root, like a TorchTitan parallelize()."""
    dims = mesh.dims
    if dims.tp_enabled:
        dims.check_heads(a.n_heads, a.n_kv_heads)
        mp.parallelize_module(model, mesh["tp"], tp_plan(a))
    if dims.fsdp_enabled or dims.dp_replicate > 1:
        for i, layer in enumerate(model.layers):
            last = i == a.n_layers - 1
            mp.fully_shard(layer, mesh, reshard_after_forward=mp.reshard_after_forward_for(policy, last=last),
                           disable_gradient_division=not divide)
        mp.fully_shard(model, mesh, reshard_after_forward=mp.reshard_after_forward_for(policy, last=True),
                       disable_gradient_division=not divide)
    return model


# ----------------------------------------------------------------------------- training
class ParallelLoss(nn.Cell):
    """sum(loss * mask) / tokens, the output projection fused with the loss as the Trainer runs it
    (mf-parallel's LinearCrossEntropy, vocab-parallel under tp): a planned output leaf hands its
    input and weight (`linear_terms`), an unplanned one (one process) its own weight."""

    def __init__(self, model: Tiny, tp_group) -> None:
        super().__init__()
        self.model = model
        self.ce = mp.LinearCrossEntropy(tp_group if tp_group.size > 1 else None)
        self.planned = hasattr(type(model.output), "_mf_base")

    def construct(self, ids, labels, mask, denom):
        h = self.model.hidden(ids)
        terms = self.model.output.linear_terms(h) if self.planned else ((h, self.model.output.weight),)
        return self.ce(terms, labels, mask) / denom


class ReferenceLoss(nn.Cell):
    """The single-process loss with MindSpore's own sparse softmax cross entropy."""

    def __init__(self, model: Tiny) -> None:
        super().__init__()
        self.model = model
        self.ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="none")

    def construct(self, ids, labels, mask, denom):
        logits = self.model(ids)
        token_loss = self.ce(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)).reshape(labels.shape)
        return (token_loss * mask).sum() / denom


class ReferenceClip(nn.Cell):
    """torch.nn.utils.clip_grad_norm_ on full gradients, written out independently."""

    def __init__(self, max_norm: float) -> None:
        super().__init__()
        self.max_norm = max_norm

    def construct(self, grads):
        total = ops.zeros((), ms.float32)
        for g in grads:
            total = total + (g * g).sum()
        norm = ops.sqrt(total)
        scale = ops.minimum(self.max_norm / (norm + 1e-6), ops.ones((), ms.float32))
        clipped = ()
        for g in grads:
            clipped = clipped + (g * scale,)
        return clipped, norm


class _NoSync(nn.Cell):
    def construct(self, grads):
        return grads


class TrainStep(nn.Cell):
    """One compiled (GRAPH_MODE) or eager step: loss, gradients, the bucketed reduce-scatters and
    all-reduces a plan left to the step (`mp.enable_gradient_buckets`, `mp.defer_gradient_syncs`,
    as the Trainer does), global-norm clip, SGD update."""

    def __init__(self, loss_net, clip, lr: float = 0.5, deferred=None, buckets=None) -> None:
        super().__init__()
        self.loss_net = loss_net
        self.weights = ms.ParameterTuple(loss_net.trainable_params())
        self.opt = nn.SGD(self.weights, learning_rate=lr, momentum=0.5)
        self.value_and_grad = ms.value_and_grad(self.loss_net, None, self.weights)
        self.sync = deferred.cell(list(self.weights)) if deferred is not None and deferred.count else _NoSync()
        # PyNative: the FSDP shard gradients reduce-scattered per unit bucket (mp.enable_gradient_buckets).
        self.add_buckets = buckets.cell(list(self.weights)) if buckets is not None else _NoSync()
        self.clip = clip

    def construct(self, ids, labels, mask, denom):
        loss, grads = self.value_and_grad(ids, labels, mask, denom)
        grads, norm = self.clip(self.sync(self.add_buckets(grads)))
        self.opt(grads)
        return loss, norm


def batches(a: TinyArgs, steps: int, global_batch: int, seed: int = 7):
    """Fixed data: (ids, labels, mask) of the whole global batch for each step."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        tokens = rng.integers(0, a.vocab, (global_batch, a.seq + 1)).astype(np.int32)
        mask = (rng.random((global_batch, a.seq)) > 0.2).astype(np.float32)
        out.append((tokens[:, :-1], tokens[:, 1:], mask))
    return out
