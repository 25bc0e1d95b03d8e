"""Where every parameter lives: sharding metadata, full-state gather and sharded load.

For each parameter name this rank holds, `param_layouts` tells the global shape, which block of
the global tensor this rank's stored Parameter holds (offset and shape, FSDP padding excluded),
and a replica id (0 on exactly one rank per distinct block: the one that writes it when a
checkpoint removes redundancy). That is what mf-ckpt's sharded save and reshard-on-load need; the
same layout applies to any array shaped like the stored Parameter (optimizer moments).

Parameters of the same name on different ranks combine as: tensor-parallel split along one axis
(`leaf.TPShard`), then FSDP split of dim 0 of that TP-local tensor (`fsdp.FSDPShard`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from mindspore import Tensor, nn

from mf_parallel.collectives import all_reduce
from mf_parallel.dims import AXES
from mf_parallel.errors import ParallelConfigError
from mf_parallel.fsdp import FSDPShard
from mf_parallel.leaf import TPShard, plan_of
from mf_parallel.mesh import DeviceMesh


@dataclass(frozen=True)
class ParamLayout:
    """One parameter as stored on this rank."""

    name: str
    global_shape: tuple[int, ...]
    offset: tuple[int, ...]          # of this rank's real block in the global tensor
    shape: tuple[int, ...]           # of the real block (dim 0 may be 0: this rank holds only padding)
    stored_shape: tuple[int, ...]    # of the Parameter (FSDP pads dim 0)
    replica_id: int
    sharded_axes: tuple[str, ...]    # mesh axes over which the blocks differ

    def to_block(self, stored: np.ndarray) -> np.ndarray:
        """The real block of an array shaped like the stored Parameter (drops FSDP padding)."""
        if tuple(stored.shape) != self.stored_shape:
            raise ParallelConfigError(f"{self.name}: expected an array of shape {list(self.stored_shape)}, "
                                      f"got {list(stored.shape)}")
        return stored[: self.shape[0]] if self.shape else stored

    def from_block(self, block: np.ndarray) -> np.ndarray:
        """An array shaped like the stored Parameter holding `block` (zero FSDP padding)."""
        if tuple(block.shape) != self.shape:
            raise ParallelConfigError(f"{self.name}: block has shape {list(block.shape)}, expected {list(self.shape)}")
        if self.shape == self.stored_shape:
            return block
        out = np.zeros(self.stored_shape, dtype=block.dtype)
        out[: self.shape[0]] = block
        return out


def _layout(name: str, stored_shape: tuple[int, ...], tp: TPShard | None, fsdp: FSDPShard | None,
            mesh: DeviceMesh, ep: TPShard | None = None) -> ParamLayout:
    local_shape = tuple(fsdp.shape) if fsdp is not None else stored_shape
    global_shape = tp.full_shape if tp is not None else ep.full_shape if ep is not None else local_shape
    offset = [0] * len(global_shape)
    shape = list(local_shape)
    sharded = {"pp"}   # pipeline stages hold different parameters
    if tp is not None and tp.size > 1:
        offset[tp.axis] = tp.index * local_shape[tp.axis]
        sharded.add("tp")
    if ep is not None and ep.size > 1:
        # Expert blocks: ep rank i holds experts [i E/ep, (i+1) E/ep); any FSDP split over the ranks
        # holding the same experts (dp_shard_mod_ep) comes on top. Together they differ on every
        # rank of dp_shard x cp, which is what ep and dp_shard_mod_ep partition.
        offset[0] = ep.index * local_shape[0]
        sharded.update(a for a in ("dp_shard", "cp") if mesh.dims.size(a) > 1)
    if fsdp is not None and not fsdp.replicated and fsdp.size > 1:
        start, count = fsdp.valid_rows
        offset[0] += start
        shape[0] = count
        sharded.update(a for a in ("dp_shard", "cp") if mesh.dims.size(a) > 1)
    replica_id, stride = 0, 1
    for axis in reversed(AXES):
        if axis not in sharded:
            replica_id += mesh.coords[axis] * stride
            stride *= mesh.dims.size(axis)
    return ParamLayout(name=name, global_shape=tuple(global_shape), offset=tuple(offset), shape=tuple(shape),
                       stored_shape=tuple(stored_shape), replica_id=replica_id,
                       sharded_axes=tuple(a for a in AXES if a in sharded))


def param_layouts(model: nn.Cell, mesh: DeviceMesh) -> dict[str, ParamLayout]:
    """Layout of every parameter of `model` on this rank, by parameter name."""
    owners: dict[int, tuple[TPShard | None, FSDPShard | None, TPShard | None]] = {}
    for _, cell in model.cells_and_names():
        plan = plan_of(cell)
        if plan is None:
            continue
        for pname in plan.names:
            param = getattr(cell, pname)
            fsdp = plan.fsdp.shards.get(pname) if plan.fsdp is not None else None
            owners[id(param)] = (plan.tp_shards.get(pname), fsdp, plan.ep_shards.get(pname))
    layouts = {}
    for name, param in model.parameters_and_names():
        tp, fsdp, ep = owners.get(id(param), (None, None, None))
        layouts[name] = _layout(name, tuple(param.shape), tp, fsdp, mesh, ep)
    return layouts


def shard_metadata(model: nn.Cell, mesh: DeviceMesh) -> dict[str, dict]:
    """Plain-data layouts (JSON-ready) for checkpoint writers."""
    return {name: {"global_shape": list(lay.global_shape), "offset": list(lay.offset), "shape": list(lay.shape),
                   "replica_id": lay.replica_id, "sharded_axes": list(lay.sharded_axes)}
            for name, lay in param_layouts(model, mesh).items()}


def local_blocks(model: nn.Cell, mesh: DeviceMesh) -> dict[str, np.ndarray]:
    """This rank's real block of every parameter (padding removed)."""
    layouts = param_layouts(model, mesh)
    return {name: layouts[name].to_block(param.asnumpy()) for name, param in model.parameters_and_names()}


def gather_full_state(model: nn.Cell, mesh: DeviceMesh, *, every: dict[str, tuple] | None = None,
                      skip=()) -> dict[str, np.ndarray]:
    """Every parameter as its full global array, on every rank (collective over the world).

    Each block is added once (by its replica 0) into a zero buffer of the global size and the
    buffers are summed over the world: exact, since every element has exactly one contributor.
    One all-reduce per dtype. When ranks hold different parameters (pipeline stages), `every`
    gives every rank the same list to build: {name: (global shape, numpy dtype)} of the whole
    model; `skip` are parameters another rank contributes (the last stage's copy of a tied table).
    """
    layouts = param_layouts(model, mesh)
    params = dict(model.parameters_and_names())
    skipped = {id(p) for p in skip}
    if every is None:
        every = {name: (layouts[name].global_shape, p.asnumpy().dtype) for name, p in params.items()}
    by_dtype: dict[np.dtype, list[tuple[str, np.ndarray]]] = {}
    for name, (shape, dtype) in every.items():
        buf = np.zeros(shape, dtype=dtype)
        param, lay = params.get(name), layouts.get(name)
        if (param is not None and id(param) not in skipped and lay.replica_id == 0
                and all(s > 0 for s in lay.shape)):
            index = tuple(slice(o, o + s) for o, s in zip(lay.offset, lay.shape))
            buf[index] = lay.to_block(param.asnumpy())
        by_dtype.setdefault(buf.dtype, []).append((name, buf))
    world = mesh["world"]
    out: dict[str, np.ndarray] = {}
    for _, items in by_dtype.items():
        flat = np.concatenate([buf.reshape(-1) for _, buf in items])
        total = all_reduce(Tensor(flat), world).asnumpy() if world.size > 1 else flat
        pos = 0
        for name, buf in items:
            out[name] = total[pos:pos + buf.size].reshape(buf.shape)
            pos += buf.size
    return out


def load_sharded_state(model: nn.Cell, mesh: DeviceMesh,
                       read_block: Callable[[str, tuple[int, ...], tuple[int, ...]], np.ndarray]) -> None:
    """Set every parameter from `read_block(name, offset, shape)` -> this rank's real block."""
    layouts = param_layouts(model, mesh)
    for name, param in model.parameters_and_names():
        lay = layouts[name]
        block = np.asarray(read_block(name, lay.offset, lay.shape))
        param.set_data(Tensor(lay.from_block(block).astype(param.asnumpy().dtype, copy=False), dtype=param.dtype))


def load_full_state(model: nn.Cell, mesh: DeviceMesh, state: dict[str, np.ndarray]) -> None:
    """Set every parameter from full global arrays (e.g. a single-process checkpoint)."""
    layouts = param_layouts(model, mesh)
    missing = sorted(set(layouts) - set(state))
    if missing:
        raise ParallelConfigError(f"load_full_state: no value for {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    for name, lay in layouts.items():
        if tuple(state[name].shape) != lay.global_shape:
            raise ParallelConfigError(f"load_full_state: {name} has shape {list(state[name].shape)}, "
                                      f"the model expects {list(lay.global_shape)}")

    def read(name, offset, shape):
        return state[name][tuple(slice(o, o + s) for o, s in zip(offset, shape))]

    load_sharded_state(model, mesh, read)
