"""Muon: Newton-Schulz orthogonalised momentum for the 2-D hidden weights, AdamW for the rest.

For each Muon matrix W [A, B] with gradient G (Moonlight's and MindFormers' formulation):

    M <- mu * M + G                                   (momentum buffer, `momentum.<name>`)
    U <- G + mu * M   (nesterov)   or   U <- M
    O <- NS_k(U)                                      (k quintic Newton-Schulz steps, below)
    W <- W * (1 - lr * wd) - lr * s(A, B) * O         (decoupled decay; s: `MuonOptions.update_scale`)

NS_k: X = U / (||U||_F + 1e-7), transposed so that it is wide (A <= B); then k times
X <- a X + (b X X^T + c (X X^T)^2) X with (a, b, c) = `ns_coefficients`; transposed back.
It drives every singular value of U towards 1 (the orthogonal polar factor) without an SVD.
PyTorch's `torch.optim.Muon` keeps M' = (1 - mu) M instead (a lerp); NS normalises U first, so
both give the same O up to the 1e-7 guard. The references orthogonalise in bfloat16 for speed;
here it is float32 (no bfloat16 matmul on CPU; and the parity tests need float32 anyway).

Every other trained parameter (embeddings, head, norms, biases, `adamw_params` matches, and the
3-D stacked MoE expert weights) is updated by this package's `AdamW` with the section's betas,
eps and weight decay; both parts follow the same LR schedule (the RMS-matching scale is what lets
AdamW's LR and decay transfer, Moonlight's result).

Sharded matrices: NS needs the whole matrix (it is not row-separable). An FSDP-sharded weight
keeps a dim-0 shard of W, G and M; the momentum update is element-wise and runs on the shard,
then U is all-gathered over the FSDP shard group (mf-parallel's `AllGather`; the padding rows
dropped), orthogonalised whole on every rank of the group, and each rank keeps its own rows of O.
So the update is the one-process update (the dist test checks it). HSDP replicas hold identical
shards and need nothing more. Tensor-parallel slices are refused (the preflight says why).

The skipped step (non-finite loss or norm; the caller passes zero gradients and `apply` False) is
exact without a graph `if`, as in AdamW: mu -> 1 keeps M, lr -> 0 keeps W.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from mf_trainer.adamw import AdamW, checked_moments
from mf_trainer.errors import TrainerConfigError
from mf_trainer.optimizer_options import MuonOptions

NS_EPS = 1e-7


@dataclass(frozen=True)
class MatrixShard:
    """Where a Muon matrix lives: the full [rows, cols] matrix, and this rank's dim-0 block of it.

    `group` None: the Parameter is the whole matrix. Otherwise the Parameter holds `chunk` rows,
    the real ones being rows [start, start + count) of the matrix (FSDP pads the last ranks)."""

    rows: int
    cols: int
    group: object = None   # mf_parallel Group of the FSDP shard
    chunk: int = 0
    start: int = 0
    count: int = 0


def newton_schulz(x, steps: int, coefficients: Sequence[float], transpose: bool):
    """NS_k of a 2-D float32 tensor (see the module docstring); graph-compatible."""
    a, b, c = coefficients
    if transpose:
        x = ops.transpose(x, (1, 0))
    x = x / (ops.sqrt(ops.reduce_sum(x * x)) + NS_EPS)
    gram = ops.MatMul(transpose_b=True)
    for _ in range(steps):
        xx = gram(x, x)
        x = a * x + ops.matmul(b * xx + c * ops.matmul(xx, xx), x)
    if transpose:
        x = ops.transpose(x, (1, 0))
    return x


class Orthogonalise(nn.Cell):
    """U (shaped like the stored Parameter) -> s * NS_k(full U), this rank's rows, stored shape."""

    def __init__(self, shard: MatrixShard, options: MuonOptions):
        super().__init__()
        self.steps = options.ns_steps
        self.coefficients = tuple(options.ns_coefficients)
        self.transpose = shard.rows > shard.cols
        self.scale = float(options.update_scale(shard.rows, shard.cols))
        self.sharded = shard.group is not None and shard.group.size > 1
        self.rows, self.cols = shard.rows, shard.cols
        self.start, self.count, self.chunk = shard.start, shard.count, shard.chunk
        self.padded = self.sharded and shard.chunk * shard.group.size != shard.rows
        self.tail = self.chunk - self.count   # padding rows this rank holds
        if self.sharded:
            import mf_parallel as mp

            self.gather = mp.AllGather(shard.group, 0)

    def construct(self, u):
        full = u
        if self.sharded:
            full = self.gather(u)
            if self.padded:
                full = full[: self.rows]
        out = newton_schulz(full, self.steps, self.coefficients, self.transpose) * self.scale
        if not self.sharded:
            return out
        if self.count == 0:
            return ops.zeros((self.chunk, self.cols), out.dtype)
        mine = out[self.start: self.start + self.count]
        if self.tail > 0:
            mine = ops.concat((mine, ops.zeros((self.tail, self.cols), out.dtype)), 0)
        return mine


class Muon(nn.Cell):
    """`Muon(params, use_muon, options, shards, betas, eps, weight_decay, decay)`.

    Same interface as `AdamW` (what the compiled step and the checkpoint glue use): `params`,
    `param_names`, `step`, `scalars(lr)`, `construct(grads, apply, lr, eps, decay)`,
    `state_dict()` / `load_state_dict()`, `moment_names()`, `moment_owners()`. `use_muon[i]`:
    params[i] is a Muon matrix (its `shards` entry says where it lives); the others go to AdamW.
    """

    def __init__(self, params: Sequence[Parameter], use_muon: Sequence[bool], options: MuonOptions,
                 shards: Sequence[MatrixShard], betas=(0.9, 0.95), eps: float = 1e-8, weight_decay: float = 0.01,
                 decay: Sequence[bool] | None = None):
        super().__init__(auto_prefix=False)
        params = list(params)
        decay = [True] * len(params) if decay is None else list(decay)
        if not (len(use_muon) == len(decay) == len(params)):
            raise ValueError("use_muon and decay need one entry per parameter")
        self.options = options
        self.param_names = [p.name for p in params]
        self.params = ParameterTuple(params)
        self.muon_index = tuple(i for i, u in enumerate(use_muon) if u)
        self.adamw_index = tuple(i for i, u in enumerate(use_muon) if not u)
        if len(shards) != len(self.muon_index):
            raise ValueError(f"{len(shards)} shards for {len(self.muon_index)} Muon parameters")
        self.has_adamw = bool(self.adamw_index)
        self.adamw = AdamW([params[i] for i in self.adamw_index], betas=betas, eps=eps, weight_decay=weight_decay,
                           decay=[decay[i] for i in self.adamw_index])
        muon_params = [params[i] for i in self.muon_index]
        self.muon_names = [p.name for p in muon_params]
        self.muon_params = ParameterTuple(muon_params)
        self.momentum = self.muon_params.clone(prefix="momentum", init="zeros")
        self.weight_decay = float(weight_decay)
        self.muon_decay = tuple(bool(decay[i]) and self.weight_decay > 0.0 for i in self.muon_index)
        self.mu = float(options.momentum)
        self.nesterov = bool(options.nesterov)
        self.orthogonalise = nn.CellList([Orthogonalise(s, options) for s in shards])
        self.step = 0

    # ---- host side -------------------------------------------------------------------------
    def scalars(self, lr: float) -> tuple[Tensor, Tensor, Tensor]:
        """(lr pair, eps', decay'): lr pair = [AdamW's bias-corrected lr', Muon's lr]; eps' and decay'
        are AdamW's (see `AdamW.scalars`). The step passes the three through unchanged."""
        self.adamw.step = self.step
        adam_lr, eps, decay = self.adamw.host_scalars(lr)
        return (Tensor(np.array([adam_lr, float(lr)], np.float32)), Tensor(np.float32(eps)),
                Tensor(np.float32(decay)))

    def moment_owners(self) -> list[tuple[str, Parameter]]:
        """(state key, the parameter it belongs to): checkpoints give a moment its parameter's layout."""
        return [*self.adamw.moment_owners(), *((f"momentum.{n}", p) for n, p in zip(self.muon_names, self.muon_params))]

    def moment_names(self) -> list[str]:
        return [key for key, _ in self.moment_owners()]

    def state_dict(self) -> dict:
        state = self.adamw.state_dict()
        for name, buf in zip(self.muon_names, self.momentum):
            state[f"momentum.{name}"] = buf.asnumpy().copy()
        state["step"] = self.step
        return state

    def load_state_dict(self, state: dict) -> None:
        """Inverse of `state_dict`; everything is checked before anything is written."""
        values = checked_moments(state, ((f"momentum.{n}", buf) for n, buf in zip(self.muon_names, self.momentum)))
        self.adamw.load_state_dict(state)   # checks its own moments first, then writes them
        for name, buf in zip(self.muon_names, self.momentum):
            buf.set_data(Tensor(values[f"momentum.{name}"]))
        self.step = int(state["step"])

    # ---- graph side ------------------------------------------------------------------------
    def construct(self, grads, apply, lr, eps, decay):
        if self.has_adamw:
            adam_grads = ()
            for i in self.adamw_index:
                adam_grads = adam_grads + (grads[i],)
            self.adamw(adam_grads, apply, lr[0], eps, decay)
        mu = ops.where(apply, self.mu, 1.0)
        lr_muon = ops.where(apply, lr[1], 0.0)
        shrink = 1.0 - lr_muon * self.weight_decay
        done = lr_muon
        for j in range(len(self.muon_index)):
            grad = grads[self.muon_index[j]]
            buf = self.momentum[j]
            new_buf = mu * buf + grad
            # One gather after another in the same order on every rank: a compiled graph may
            # otherwise issue independent collectives in any order, and MCCL's would then mismatch.
            new_buf = ops.depend(new_buf, done)
            ops.assign(buf, new_buf)
            u = grad + self.mu * new_buf if self.nesterov else new_buf
            update = self.orthogonalise[j](u)
            param = self.muon_params[j]
            kept = param * shrink if self.muon_decay[j] else param
            done = ops.assign(param, kept - lr_muon * update)
        return done


def matrix_shards(params: Sequence[Parameter], layouts: dict | None, mesh) -> list[MatrixShard]:
    """Where each Muon matrix lives, from mf-parallel's layouts (by parameter id; None: one process)."""
    out = []
    for p in params:
        lay = None if layouts is None else layouts.get(id(p))
        if lay is None or not set(lay.sharded_axes) & {"dp_shard", "cp", "tp"}:
            rows, cols = (lay.global_shape if lay is not None else tuple(p.shape))
            out.append(MatrixShard(int(rows), int(cols)))
            continue
        if "tp" in lay.sharded_axes:
            raise TrainerConfigError(f"optimizer.type: Muon cannot orthogonalise {lay.name}, which is split by "
                                     "tensor parallelism (not implemented); use parallelism.tensor_parallel: 1")
        rows, cols = lay.global_shape
        out.append(MatrixShard(int(rows), int(cols), mesh["dp_shard_cp"], int(lay.stored_shape[0]), int(lay.offset[0]),
                               int(lay.shape[0])))
    return out


def build_muon(named_params: Sequence[tuple[str, Parameter]], cfg, options: MuonOptions, layouts: dict | None = None,
               mesh=None) -> Muon:
    """Muon from the YAML `optimizer` section; `layouts`: mf-parallel ParamLayouts by parameter id."""
    from mf_trainer.optimizer_options import muon_mask
    from mf_trainer.weight_decay import decay_mask

    names = [n for n, _ in named_params]
    params = [p for _, p in named_params]
    shapes = [tuple(layouts[id(p)].global_shape) if layouts and id(p) in layouts else tuple(p.shape) for p in params]
    use = muon_mask(names, shapes, options.adamw_params)
    for p, u in zip(params, use):
        if u and p.dtype != ms.float32:
            raise TrainerConfigError(f"optimizer.type: Muon keeps float32 weights; {p.name} is {p.dtype}")
    mask = decay_mask(names, getattr(cfg, "weight_decay_include", None), getattr(cfg, "weight_decay_exclude", None))
    shards = matrix_shards([p for p, u in zip(params, use) if u], layouts, mesh)
    return Muon(params, use, options, shards, betas=tuple(getattr(cfg, "betas", (0.9, 0.95))),
                eps=float(getattr(cfg, "eps", 1e-8)), weight_decay=float(getattr(cfg, "weight_decay", 0.01)),
                decay=mask)


__all__ = ["MatrixShard", "Muon", "Orthogonalise", "build_muon", "matrix_shards", "newton_schulz"]
