"""train_bench.py's second reference: the same llama train step written in plain MindSpore.

No mf import: what a MindSpore user would write by hand for this model, compiled whole in
GRAPH_MODE. Plain Cells (MatMul with the [out, in] weight transposed inside the kernel, gather
embedding, RMSNorm from ReduceMean/Rsqrt, RoPE by rotate_half with cos/sin constants, causal
attention by BatchMatMul + additive mask + Softmax, SwiGLU), `SparseSoftmaxCrossEntropyWithLogits`
for the loss, `ops.clip_by_global_norm` and MindSpore's torch-semantics
`mindspore.experimental.optim.AdamW` (weight decay off the norms, as the other two sides).
It is the bar for "what MindSpore can do": mf's structure should add speed to it, not cost.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops


def _param(shape, name):
    return Parameter(Tensor(np.zeros(shape, np.float32)), name=name)


class Linear(nn.Cell):
    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.weight = _param((d_out, d_in), "weight")
        self.matmul = ops.MatMul(transpose_b=True)

    def construct(self, x):
        shape = x.shape
        return self.matmul(x.reshape(-1, shape[-1]), self.weight).reshape(shape[:-1] + (-1,))


class Embedding(nn.Cell):
    def __init__(self, vocab: int, dim: int):
        super().__init__()
        self.weight = _param((vocab, dim), "weight")
        self.gather = ops.Gather()

    def construct(self, ids):
        return self.gather(self.weight, ids, 0)


class RMSNorm(nn.Cell):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = _param((dim,), "weight")
        self.eps = eps
        self.mean = ops.ReduceMean(keep_dims=True)
        self.rsqrt = ops.Rsqrt()

    def construct(self, x):
        return self.weight * (x * self.rsqrt(self.mean(x * x, -1) + self.eps))


class Attention(nn.Cell):
    def __init__(self, dim: int, heads: int, seq: int):
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.wq, self.wk, self.wv, self.wo = (Linear(dim, dim) for _ in range(4))
        self.qk = ops.BatchMatMul(transpose_b=True)
        self.pv = ops.BatchMatMul()
        self.softmax = ops.Softmax(-1)
        self.scale = self.hd ** -0.5
        self.mask = Tensor(np.triu(np.full((seq, seq), -1e9, np.float32), 1))

    def rope(self, x, cos, sin):
        half = self.hd // 2
        rotated = ops.concat((-x[..., half:], x[..., :half]), -1)
        return x * cos + rotated * sin

    def construct(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.wq(x).reshape(b, s, self.heads, self.hd).transpose(0, 2, 1, 3)
        k = self.wk(x).reshape(b, s, self.heads, self.hd).transpose(0, 2, 1, 3)
        v = self.wv(x).reshape(b, s, self.heads, self.hd).transpose(0, 2, 1, 3)
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        probs = self.softmax(self.qk(q, k) * self.scale + self.mask)
        out = self.pv(probs, v).transpose(0, 2, 1, 3).reshape(b, s, -1)
        return self.wo(out)


class FeedForward(nn.Cell):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1, self.w3, self.w2 = Linear(dim, hidden), Linear(dim, hidden), Linear(hidden, dim)
        self.silu = nn.SiLU()

    def construct(self, x):
        return self.w2(self.silu(self.w1(x)) * self.w3(x))


class Block(nn.Cell):
    def __init__(self, dim: int, heads: int, hidden: int, seq: int, eps: float):
        super().__init__()
        self.attention_norm, self.attention = RMSNorm(dim, eps), Attention(dim, heads, seq)
        self.ffn_norm, self.feed_forward = RMSNorm(dim, eps), FeedForward(dim, hidden)

    def construct(self, x, cos, sin):
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Cell):
    """Parameter names as mf's model_state, so the same initial weights load by name."""

    def __init__(self, vocab: int, dim: int, layers: int, heads: int, hidden: int, seq: int, eps: float):
        super().__init__()
        self.tok_embeddings = Embedding(vocab, dim)
        self.layers = nn.CellList([Block(dim, heads, hidden, seq, eps) for _ in range(layers)])
        self.norm, self.output = RMSNorm(dim, eps), Linear(dim, vocab)
        hd = dim // heads
        inv = 1.0 / (10000.0 ** (np.arange(0, hd, 2, dtype=np.float32) / hd))
        emb = np.concatenate([np.outer(np.arange(seq, dtype=np.float32), inv)] * 2, -1)
        self.cos, self.sin = Tensor(np.cos(emb)), Tensor(np.sin(emb))

    def construct(self, ids):
        h = self.tok_embeddings(ids)
        for layer in self.layers:
            h = layer(h, self.cos, self.sin)
        return self.output(self.norm(h))


class LossCell(nn.Cell):
    def __init__(self, model: Llama):
        super().__init__(auto_prefix=False)
        self.model = model
        self.ce = ops.SparseSoftmaxCrossEntropyWithLogits()  # mean over tokens

    def construct(self, ids, labels):
        logits = self.model(ids)
        return self.ce(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


class TrainStep(nn.Cell):
    def __init__(self, loss_cell: LossCell, optimizer, max_norm: float):
        super().__init__(auto_prefix=False)
        self.loss_cell = loss_cell
        self.optimizer = optimizer
        self.weights = optimizer.parameters  # the optimizer's order (decay group, then no-decay)
        self.grad_fn = ms.value_and_grad(loss_cell, None, self.weights)
        self.max_norm = max_norm

    def construct(self, ids, labels):
        loss, grads = self.grad_fn(ids, labels)
        grads = ops.clip_by_global_norm(grads, self.max_norm)
        self.optimizer(grads)
        return loss


def build_step(model_args: dict, state: dict[str, np.ndarray], lr: float, betas, eps: float, weight_decay: float,
               max_norm: float) -> TrainStep:
    """The compiled step over a model holding `state` (name -> array, mf's parameter names)."""
    from mindspore.experimental.optim import AdamW

    a = model_args
    model = Llama(a["vocab_size"], a["hidden_size"], a["num_hidden_layers"], a["num_attention_heads"],
                  a["intermediate_size"], a["seq_length"], a["rms_norm_eps"])
    params = {p.name: p for p in model.trainable_params()}
    missing = set(params) ^ set(state)
    if missing:
        raise KeyError(f"hand-written model and mf's state differ in {sorted(missing)[:5]}")
    for name, p in params.items():
        p.set_data(Tensor(state[name]))
    decay = [p for n, p in params.items() if "norm" not in n]
    no_decay = [p for n, p in params.items() if "norm" in n]
    opt = AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                lr=lr, betas=tuple(betas), eps=eps)
    return TrainStep(LossCell(model), opt, max_norm)
