"""Vocab-parallel cross entropy: the loss on logits that stay split along the vocabulary.

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

from mf_parallel.autograd import ReduceFromGroup
from mf_parallel.collectives import AllReduce
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
