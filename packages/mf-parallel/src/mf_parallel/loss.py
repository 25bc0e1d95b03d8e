"""Cross entropy without the whole logits: vocab-parallel, and fused with the output projection.

`LinearCrossEntropy` (below) computes the loss straight from the hidden states and the output
projection's weight, chunk by chunk, on one process or vocab-parallel. `VocabParallelCrossEntropy`
takes logits that stay split along the vocabulary:

Each tensor-parallel rank holds logits[..., V/tp] for its vocabulary slice. The loss of a token is
log(sum_v exp(l_v)) - l_label, computed without ever gathering the logits:

  m      = max over the whole vocabulary (all-reduce max; treated as a constant: the shift of a
           log-sum-exp does not change its value or gradient)
  s      = sum of exp(l - m) over the vocabulary (all-reduce sum, identity backward)
  picked = l_label - m from the one rank whose slice holds the label (all-reduce sum, identity
           backward)
  loss   = log(s) - picked

The gradient reaching each rank's logits is softmax - onehot restricted to its slice, which is the
single-process gradient. With a one-rank group this is the ordinary sparse cross entropy.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from mf_parallel import LINEAR_CE_CHUNK_BYTES
from mf_parallel.autograd import ReduceFromGroup
from mf_parallel.collectives import AllGather, AllReduce
from mf_parallel.errors import ParallelConfigError
from mf_parallel.mesh import Group

_ONES_LIKE = ops.OnesLike()


class VocabParallelCrossEntropy(nn.Cell):
    """Per-token loss from vocab-sharded `logits` [..., V/tp] and global `labels` [...].

    Labels outside [0, V) (e.g. -100) give a finite value that the caller's loss mask removes.
    Computation is in float32.
    """

    def __init__(self, tp_group: Group) -> None:
        super().__init__()
        # The rank enters the graph as data (see tensor_parallel.vocab_parallel_embedding_forward).
        self.rank = ms.Tensor(tp_group.rank, ms.int32)
        self.max_reduce = AllReduce(tp_group, "max")
        self.sum_reduce = ReduceFromGroup(tp_group)
        self.pick_reduce = ReduceFromGroup(tp_group)

    def construct(self, logits, labels):
        logits = ops.cast(logits, ms.float32)
        vocab = logits.shape[-1]
        shift = ops.stop_gradient(self.max_reduce(ops.stop_gradient(logits.max(axis=-1, keepdims=True))))
        shifted = logits - shift
        sum_exp = self.sum_reduce(ops.exp(shifted).sum(-1))
        local = labels - self.rank * vocab
        inside = ops.logical_and(local >= 0, local < vocab)
        safe = ops.where(inside, local, ops.zeros_like(local))
        picked = ops.gather_elements(shifted, -1, safe.expand_dims(-1)).squeeze(-1)
        picked = self.pick_reduce(picked * inside.astype(picked.dtype))
        return ops.log(sum_exp) - picked



class VocabParallelArgmax(nn.Cell):
    """Global argmax [...] (int32 ids in [0, V)) of vocab-sharded `logits` [..., V/tp].

    The one-process `argmax` picks the first index of the maximum; so does this: the maximum over
    the whole vocabulary (all-reduce max), then on each rank the first local index holding it as a
    global id (V where the slice has none), and the smallest of those (all-reduce min). Forward
    only (evaluation's token accuracy): ids carry no gradient. With a one-rank group it is argmax.
    """

    def __init__(self, tp_group: Group) -> None:
        super().__init__()
        self.rank = ms.Tensor(tp_group.rank, ms.int32)
        self.size = tp_group.size
        self.max_reduce = AllReduce(tp_group, "max")
        self.min_reduce = AllReduce(tp_group, "min")

    def construct(self, logits):
        logits = ops.stop_gradient(ops.cast(logits, ms.float32))
        vocab = logits.shape[-1]
        top = self.max_reduce(logits.max(axis=-1, keepdims=True))
        ids = ops.arange(0, vocab, dtype=ms.int32) + self.rank * vocab
        # float32 ids are exact below 2^24: the min travels in float32, as every collective here does.
        none = _ONES_LIKE(logits) * float(vocab * self.size)
        candidates = ops.where(logits == top, ids.astype(ms.float32), none)
        return self.min_reduce(candidates.min(axis=-1)).astype(ms.int32)


# ------------------------------------------------------------------------ fused projection + loss
CHUNK_BYTES = LINEAR_CE_CHUNK_BYTES

_MATMUL_NT = ops.MatMul(transpose_b=True)
_MATMUL = ops.MatMul()
_MATMUL_TN = ops.MatMul(transpose_a=True)
_CAST = ops.Cast()
_LOG_SOFTMAX = ops.LogSoftmax(axis=-1)
_ONE_HOT = ops.OneHot(axis=-1)


def _chunk_rows(chunk_bytes: int, rows: int, vocab: int) -> int:
    """Rows of a chunk: at most `chunk_bytes` of float32 logits (at least one row)."""
    return max(1, min(rows, chunk_bytes // (4 * vocab)))


class _FusedChunks(nn.Cell):
    """One process: (loss, the gradient of each term's input, of each term's weight) of
    sum_i mask_i * CE(sum_t x_t,i w_t^T, label_i), chunk by chunk, gradients for a unit upstream
    gradient; `bprop` of the arity subclasses scales them by the real one. Per chunk: the label's
    -log_softmax from the fused LogSoftmax kernel and softmax - onehot from the sparse kernel's
    gradient mode (which divides it by the rows: undone with the mask's weights)."""

    def __init__(self, chunk_bytes: int, trained: tuple) -> None:
        super().__init__()
        self.trained = tuple(bool(t) for t in trained)
        self.chunk_bytes = int(chunk_bytes)
        self.softmax_minus_onehot = ops.SparseSoftmaxCrossEntropyWithLogits(is_grad=True)

    def run(self, xs, ws, labels, mask):
        rows = labels.shape[0]
        step = _chunk_rows(self.chunk_bytes, rows, ws[0].shape[0])
        loss = ops.zeros((), ms.float32)
        dxs = ()
        dws = ()
        for _ in range(len(xs)):
            dxs = dxs + ((),)
            dws = dws + (None,)
        for start in range(0, rows, step):
            size = min(step, rows - start)
            parts = ()
            for t in range(len(xs)):
                part = xs[t][start:start + size]
                if start:
                    # Chunk after chunk: without these edges the graph runtime may start every
                    # chunk's projection at once and hold all their [rows, V] logits together.
                    part = ops.depend(ops.depend(part, loss), dxs[t][-1])
                    if dws[t] is not None:
                        part = ops.depend(part, dws[t])
                parts = parts + (part,)
            logits = _MATMUL_NT(parts[0], ws[0])
            for t in range(1, len(xs)):
                logits = logits + _MATMUL_NT(parts[t], ws[t])
            logits = _CAST(logits, ms.float32)
            chunk_labels = labels[start:start + size]
            chunk_mask = mask[start:start + size]
            per_token = -ops.gather_elements(_LOG_SOFTMAX(logits), 1, chunk_labels.reshape(-1, 1)).reshape(-1)
            loss = loss + (per_token * chunk_mask).sum()
            grad = self.softmax_minus_onehot(logits, chunk_labels)
            # The per-token weights (the mask, the kernel's 1/rows undone) go to the [rows, K]
            # operands and results, not to the [rows, V] gradient: K << V.
            scale = (chunk_mask * float(size)).reshape(-1, 1)
            new_dxs = ()
            new_dws = ()
            for t in range(len(xs)):
                dx, dw = _term_grads(grad, parts[t], ws[t], scale, self.trained[t])
                new_dxs = new_dxs + (dxs[t] + (dx,),)
                new_dws = new_dws + ((dw if dws[t] is None else dws[t] + dw) if self.trained[t] else None,)
            dxs = new_dxs
            dws = new_dws
        grads_x = ()
        grads_w = ()
        for t in range(len(xs)):
            grads_x = grads_x + (ops.concat(dxs[t], 0) if len(dxs[t]) > 1 else dxs[t][0],)
            # A frozen weight's gradient is made in the backward (zeros), not kept from the forward.
            grads_w = grads_w + ((_CAST(dws[t], ws[t].dtype) if self.trained[t] else ops.zeros((), ws[t].dtype)),)
        return loss, grads_x, grads_w


def _term_grads(grad, x, w, scale, trained: bool):
    """(dx [rows, K] in x's dtype, dw [V, K] float32 or None) of one term for `grad` [rows, V]
    (softmax - onehot) and per-row weights `scale` [rows, 1]."""
    g = _CAST(grad, w.dtype)
    dx = _CAST(_MATMUL(g, w) * _CAST(scale, w.dtype), x.dtype)
    dw = _CAST(_MATMUL_TN(g, x * _CAST(scale, x.dtype)), ms.float32) if trained else None
    return dx, dw


class _FusedOne(_FusedChunks):
    def construct(self, x, w, labels, mask):
        loss, dx, dw = self.run((x,), (w,), labels, mask)
        return loss, dx[0], dw[0]

    def bprop(self, x, w, labels, mask, out, dout):
        d = dout[0]
        dw = out[2] * _CAST(d, w.dtype) if self.trained[0] else ops.zeros_like(w)
        return out[1] * _CAST(d, x.dtype), dw, ops.zeros_like(labels), ops.zeros_like(mask)


class _FusedTwo(_FusedChunks):
    def construct(self, x, w, x2, w2, labels, mask):
        loss, dx, dw = self.run((x, x2), (w, w2), labels, mask)
        return loss, dx[0], dw[0], dx[1], dw[1]

    def bprop(self, x, w, x2, w2, labels, mask, out, dout):
        d = dout[0]
        dw = out[2] * _CAST(d, w.dtype) if self.trained[0] else ops.zeros_like(w)
        dw2 = out[4] * _CAST(d, w2.dtype) if self.trained[1] else ops.zeros_like(w2)
        return (out[1] * _CAST(d, x.dtype), dw, out[3] * _CAST(d, x2.dtype), dw2, ops.zeros_like(labels),
                ops.zeros_like(mask))


class _VocabParallelChunk(nn.Cell):
    """One chunk on one rank of the vocabulary split, once the ranks' statistics are known: (loss,
    dx, dw) from the chunk's logits slice [rows, V/tp] (computed by the caller, not differentiated),
    the global log-sum-exp [rows] and label logit [rows]. Its own Cell with a custom bprop, apart
    from the statistics' all-gather: a collective (a side effect) inside a custom-bprop Cell breaks
    GRAPH_MODE's differentiation of what follows it."""

    def __init__(self, rank: int, trained: bool) -> None:
        super().__init__()
        self.rank = ms.Tensor(rank, ms.int32)
        self.trained = bool(trained)

    def construct(self, x, w, logits, lse, label_logit, labels, mask):
        vocab = logits.shape[-1]
        loss = ((lse - label_logit) * mask).sum()
        local = labels - self.rank * vocab
        inside = ops.logical_and(local >= 0, local < vocab)
        onehot = _ONE_HOT(ops.where(inside, local, ops.full_like(local, -1)), vocab,
                          ms.Tensor(1.0, ms.float32), ms.Tensor(0.0, ms.float32))
        grad = ops.exp(logits - lse.reshape(-1, 1)) - onehot
        dx, dw = _term_grads(grad, x, w, mask.reshape(-1, 1), self.trained)
        return loss, dx, (dw if self.trained else ops.zeros((), ms.float32))

    def bprop(self, x, w, logits, lse, label_logit, labels, mask, out, dout):
        d = dout[0]
        dw = _CAST(out[2] * d, w.dtype) if self.trained else ops.zeros_like(w)
        return (out[1] * _CAST(d, x.dtype), dw, ops.zeros_like(logits), ops.zeros_like(lse),
                ops.zeros_like(label_logit), ops.zeros_like(labels), ops.zeros_like(mask))


class LinearCrossEntropy(nn.Cell):
    """sum_i mask_i * CE(logits_i, label_i) with logits = sum_t x_t @ w_t^T, never holding the
    whole [N, V] logits: the output projection and the loss fused, chunk by chunk (Liger's fused
    linear cross entropy, Megatron's chunked loss).

    `loss(terms, labels, mask, trained=None)`: `terms` is a tuple of one or two `(x [..., K_t],
    w [V, K_t])` (the output projection as a sum of linear terms: a LoRA adapter on it is the
    second, `(scaling * x A^T, B)`); `trained` a tuple of Python bools, one per term (a constant
    when compiled; None: all True), says whether w_t needs its gradient; a frozen base weight's
    GEMM is then skipped. `labels` [...] int32 in [0, V_global), `mask` [...] float32, the leading
    shape of x. Returns a float32 scalar.

    Each chunk of at most `chunk_bytes` of float32 logits is projected, its loss taken, and its
    gradients computed at once in the forward: dx = (softmax - onehot) w and dw += (softmax -
    onehot)^T x (accumulated in float32), the per-token mask applied to the [rows, K] operands
    rather than to the [rows, V] gradient. The backward only scales them by the incoming gradient,
    so neither the logits nor their gradient outlive a chunk. One process: the label's
    -log_softmax from MindSpore's fused LogSoftmax kernel, softmax - onehot from the sparse
    cross-entropy kernel's gradient mode (the same kernels as mf-trainer's `TokenCrossEntropy`).

    `tp_group` (vocab-parallel; one term): w is this rank's slice of the vocabulary (rows rank *
    V/tp ...); each chunk makes one all-gather of two floats per token (the rank's log-sum-exp and
    label logit), after which every rank has the loss and its slice of softmax - onehot. The input
    gradient it returns is this rank's partial sum over its vocabulary slice: the projection's
    input collective (an all-gather of the sequence, whose backward reduce-scatters) adds the
    partials. Labels outside [0, V_global) must be masked out.
    """

    def __init__(self, tp_group: Group | None = None, chunk_bytes: int = CHUNK_BYTES) -> None:
        super().__init__()
        if not isinstance(chunk_bytes, int) or isinstance(chunk_bytes, bool) or chunk_bytes < 4:
            raise ParallelConfigError(f"LinearCrossEntropy: chunk_bytes must be a positive number of bytes, "
                                      f"got {chunk_bytes!r}")
        self.chunk_bytes = chunk_bytes
        self.tp = tp_group.size if tp_group is not None else 1
        if self.tp > 1:
            self.rank = ms.Tensor(tp_group.rank, ms.int32)
            self.exchange = AllGather(tp_group, 0)
            self.vp_trained = _VocabParallelChunk(tp_group.rank, True)
            self.vp_frozen = _VocabParallelChunk(tp_group.rank, False)
        # Every (terms, trained) combination, built now: which one runs is decided while compiling.
        self.one_trained = _FusedOne(chunk_bytes, (True,))
        self.one_frozen = _FusedOne(chunk_bytes, (False,))
        self.two_trained = _FusedTwo(chunk_bytes, (True, True))
        self.two_adapter = _FusedTwo(chunk_bytes, (False, True))

    def construct(self, terms, labels, mask, trained=None):
        labels = labels.reshape(-1)
        mask = ops.cast(mask, ms.float32).reshape(-1)
        x = terms[0][0]
        x = x.reshape(-1, x.shape[-1])
        w = terms[0][1]
        base_trained = True if trained is None else trained[0]
        if self.tp > 1:
            return self._vocab_parallel(x, w, labels, mask, base_trained)
        if len(terms) == 1:
            if base_trained:
                return self.one_trained(x, w, labels, mask)[0]
            return self.one_frozen(x, w, labels, mask)[0]
        # Two terms: the second (an adapter) always gets its gradient.
        x2 = terms[1][0]
        x2 = x2.reshape(-1, x2.shape[-1])
        if base_trained:
            return self.two_trained(x, w, x2, terms[1][1], labels, mask)[0]
        return self.two_adapter(x, w, x2, terms[1][1], labels, mask)[0]

    def _vocab_parallel(self, x, w, labels, mask, trained):
        rows = labels.shape[0]
        vocab = w.shape[0]
        step = _chunk_rows(self.chunk_bytes, rows, vocab)
        loss = ops.zeros((), ms.float32)
        for start in range(0, rows, step):
            size = min(step, rows - start)
            part = x[start:start + size]
            chunk_labels = labels[start:start + size]
            # Not differentiated here: the chunk Cell's bprop hands back the gradients.
            logits = ops.stop_gradient(_CAST(_MATMUL_NT(part, w), ms.float32))
            top = logits.max(axis=-1, keepdims=True)
            own_lse = top.reshape(-1) + ops.log(ops.exp(logits - top).sum(-1))
            local = chunk_labels - self.rank * vocab
            inside = ops.logical_and(local >= 0, local < vocab)
            safe = ops.where(inside, local, ops.zeros_like(local))
            picked = ops.gather_elements(logits, 1, safe.reshape(-1, 1)).reshape(-1) * inside.astype(ms.float32)
            stats = ops.stop_gradient(self.exchange(ops.stack((own_lse, picked)))).reshape(self.tp, 2, -1)
            lses = stats[:, 0]
            high = lses.max(axis=0)
            lse = high + ops.log(ops.exp(lses - high).sum(0))
            label_logit = stats[:, 1].sum(0)
            cell = self.vp_trained if trained else self.vp_frozen
            loss = loss + cell(part, w, logits, lse, label_logit, chunk_labels, mask[start:start + size])[0]
        return loss
