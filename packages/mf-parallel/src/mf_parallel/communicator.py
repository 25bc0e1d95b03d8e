"""`Communicator`: mf-ckpt's collective interface (`mf_ckpt.collectives.Collective`) over MindSpore.

mf-ckpt asks for `rank`, `world_size`, `all_gather_object(obj) -> list` and `barrier()`; it is
duck-typed, so nothing here imports mf-ckpt. Objects travel pickled: the bytes are packed into
int32 words (zero-padded to the longest message) and all-gathered. Packing into integers keeps the
CPU emulation exact for any bit pattern (an all-reduce adds zeros, and integer x + 0 == x), which
a float buffer would not guarantee (NaN bit patterns).

`exchange_bytes` is not provided: mf-ckpt then routes through all_gather_object, which on CPU is
what an emulated all-to-all would cost anyway.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
from mindspore import Tensor

from mf_parallel.backend import init_distributed
from mf_parallel.collectives import all_gather, all_reduce
from mf_parallel.mesh import Group, make_group


class Communicator:
    """Object collectives over `group` (default: the whole world). Every member calls each method
    in the same order."""

    def __init__(self, group: Group | None = None) -> None:
        if group is None:
            _, world = init_distributed()
            group = make_group("world", list(range(world)))
        self.group = group

    @property
    def rank(self) -> int:
        return self.group.rank

    @property
    def world_size(self) -> int:
        return self.group.size

    def all_gather_object(self, obj: Any) -> list[Any]:
        blob = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        if self.group.size == 1:
            return [pickle.loads(blob)]
        lengths = all_gather(Tensor(np.array([len(blob)], np.int32)), self.group).asnumpy()
        words = -(-int(lengths.max()) // 4)
        buf = np.zeros(words * 4, np.uint8)
        buf[: len(blob)] = np.frombuffer(blob, np.uint8)
        gathered = all_gather(Tensor(buf.view(np.int32).reshape(1, words)), self.group).asnumpy()
        return [pickle.loads(gathered[i].view(np.uint8)[: int(lengths[i])].tobytes()) for i in range(self.group.size)]

    def barrier(self) -> None:
        if self.group.size > 1:
            all_reduce(Tensor(np.ones(1, np.int32)), self.group).asnumpy()
