"""Building blocks shared by every model: Linear, Embedding, RMSNorm, LayerNorm, the SwiGLU and
GELU feed-forwards.

Each is a small Cell owning its own Parameters with the names of the parameter-name contract
(`weight`, `bias`), so a tensor-parallel plan can swap one sub-cell (e.g. `attention.wq`) for a
column/row-parallel version without touching the model code. Weights are [out, in] like torch.
Parameters live in `params_dtype`; matmuls run in `compute_dtype`; norms and softmax in float32.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, mint, nn, ops

from .logs import log_once

DTYPES = {"float32": ms.float32, "float16": ms.float16, "bfloat16": ms.bfloat16}


def device_target() -> str:
    return str(ms.get_context("device_target"))


def resolve_compute_dtype(name: str) -> ms.Type:
    """The dtype matmuls actually run in on this device.

    MindSpore 2.10 has no bfloat16 MatMul/BatchMatMul/Sigmoid kernels on CPU, so bfloat16 falls back
    to float32 there (said once in the log). float16 works on CPU but is slow.
    """
    if name == "bfloat16" and device_target() == "CPU":
        log_once("compute_dtype bfloat16 runs in float32 on CPU (MindSpore has no bf16 matmul kernel there)")
        return ms.float32
    return DTYPES[name]


_matmul_nt = ops.MatMul(transpose_b=True)
# Primitives in the parameter forwards below: mf-parallel may run them inside a GRAPH_MODE bprop
# (FSDP reshard-after-forward), where functional wrappers such as ops.mean fail to compile.
_gather = ops.Gather()
_mean = ops.ReduceMean(keep_dims=True)
_rsqrt = ops.Rsqrt()
_cast = ops.Cast()
# Small operands are broadcast explicitly before an elementwise op: MindSpore 2.10's CPU kernels
# for a broadcasting binary op keep ~4x their output of memory of their own for the life of the
# graph (benchmarks/README.md, "Memory"); BroadcastTo and a same-shape op do not.
_broadcast_to = ops.broadcast_to


def linear(x, weight, bias=None):
    """x [..., in] @ weight[out, in].T as one 2-D GEMM (no transposed copy of the weight)."""
    shape = x.shape
    y = _matmul_nt(x.reshape(-1, shape[-1]), weight)
    if bias is not None:
        y = y + bias
    return y.reshape(shape[:-1] + (-1,))


# Parameter forwards: each leaf's output as a pure function of the parameters handed to it. The
# Cells below call them with their own parameters; mf-parallel calls them with gathered or sliced
# ones (registered in common/parallel.py), so the plain and the parallel model share one formula.
def linear_forward(cell, weight, bias, x):
    """`Linear`: x @ weight.T (+ bias) in the cell's compute dtype (bias None when absent)."""
    if cell.cast_weight:
        weight = _cast(weight, cell.compute_dtype)
        if bias is not None:
            bias = _cast(bias, cell.compute_dtype)
    return linear(_cast(x, cell.compute_dtype), weight, bias)


def linear_forward_terms(cell, weight, bias, x):
    """`linear_forward` without a bias as linear terms ((x, weight),) in the compute dtype: what a
    fused output projection + loss (mf_parallel.LinearCrossEntropy) takes instead of the output."""
    if cell.cast_weight:
        weight = _cast(weight, cell.compute_dtype)
    return ((_cast(x, cell.compute_dtype), weight),)


# The backward of `linear_forward` in two parts, for pipeline schedules that defer the weight GEMM
# (mf-parallel's `register_weight_grad_split`): the input (and bias) gradient at once, the weight
# gradient later. Same primitives as MindSpore's own MatMul / Cast / bias-add backward.
_matmul = ops.MatMul()
_matmul_tn = ops.MatMul(transpose_a=True)


def linear_input_grad(cell, weight, bias, x, dout):
    """(dx, dbias or None) of `linear_forward` for the output gradient `dout`."""
    if cell.cast_weight:
        weight = _cast(weight, cell.compute_dtype)
    d2 = dout.reshape(-1, dout.shape[-1])
    dx = _cast(_matmul(d2, weight).reshape(x.shape), x.dtype)
    dbias = None if bias is None else _cast(d2.sum(0), bias.dtype)
    return dx, dbias


def linear_weight_grad(cell, weight, bias, x, dout):
    """dweight of `linear_forward`: dout^T x, in the weight's dtype."""
    x2 = _cast(x, cell.compute_dtype).reshape(-1, x.shape[-1])
    return _cast(_matmul_tn(dout.reshape(-1, dout.shape[-1]), x2), weight.dtype)


def embedding_forward(cell, weight, input_ids):
    """`Embedding`: row lookup (ops.gather: mint's embedding has no CPU kernel)."""
    return _gather(weight, input_ids, 0)


def rms_norm_forward(cell, weight, x):
    """`RMSNorm`: weight * x / sqrt(mean(x^2) + eps), statistics in float32, result in x's dtype."""
    dtype = x.dtype
    x32 = _cast(x, ms.float32)
    normed = _cast(x32 * _broadcast_to(_rsqrt(_mean(x32 * x32, -1) + cell.eps), x32.shape), dtype)
    return _broadcast_to(_cast(weight, dtype), normed.shape) * normed


def layer_norm_forward(cell, weight, bias, x):
    """`LayerNorm`: (x - mean) / sqrt(var + eps) * weight + bias (biased variance, as torch's
    nn.LayerNorm), statistics in float32, result in x's dtype."""
    dtype = x.dtype
    x32 = _cast(x, ms.float32)
    centred = x32 - _broadcast_to(_mean(x32, -1), x32.shape)
    normed = _cast(centred * _broadcast_to(_rsqrt(_mean(centred * centred, -1) + cell.eps), x32.shape), dtype)
    return _broadcast_to(_cast(weight, dtype), normed.shape) * normed + _broadcast_to(_cast(bias, dtype), normed.shape)


def resolve_params_dtype(name: str) -> ms.Type:
    """The dtype parameters are stored in on this device: bfloat16 falls back to float32 on CPU
    (its Gather has no bf16 kernel, and every bf16 matmul would be upcast anyway), said once."""
    if name == "bfloat16" and device_target() == "CPU":
        log_once("params_dtype bfloat16 is kept in float32 on CPU (no bf16 Gather/MatMul kernels there)")
        return ms.float32
    return DTYPES[name]


def zeros_tensor(shape: tuple[int, ...], dtype: ms.Type) -> Tensor:
    # Real values are written by `init_weights` (numpy, seeded, device-independent).
    return Tensor(np.zeros(shape, np.float32), dtype)


class Linear(nn.Cell):
    """y = x @ weight.T (+ bias); weight [out, in]."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 params_dtype: ms.Type = ms.float32, compute_dtype: ms.Type = ms.float32):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(zeros_tensor((out_features, in_features), params_dtype), name="weight")
        self.bias = Parameter(zeros_tensor((out_features,), params_dtype), name="bias") if bias else None
        self.compute_dtype = compute_dtype
        self.cast_weight = params_dtype != compute_dtype

    def construct(self, x):
        return linear_forward(self, self.weight, self.bias, x)

    def linear_terms(self, x):
        """This layer (without bias) as linear terms `((x, weight),)`: see `linear_forward_terms`."""
        return linear_forward_terms(self, self.weight, self.bias, x)

    def linear_terms_trained(self) -> tuple[bool]:
        """Whether each term's weight needs its gradient (Python, before compiling)."""
        return (bool(self.weight.requires_grad),)


class Embedding(nn.Cell):
    """Token lookup; `weight` [V, H] (ops.gather: mint's embedding has no CPU kernel)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, params_dtype: ms.Type = ms.float32,
                 padding_idx: int | None = None):
        super().__init__()
        self.weight = Parameter(zeros_tensor((num_embeddings, embedding_dim), params_dtype), name="weight")
        # HF zeroes the padding row at initialisation (nothing else): honoured by init_weights.
        self.padding_idx = padding_idx

    def construct(self, input_ids):
        return embedding_forward(self, self.weight, input_ids)


class RMSNorm(nn.Cell):
    """weight * x / sqrt(mean(x^2) + eps), statistics in float32, result in the input dtype."""

    def __init__(self, dim: int, eps: float = 1e-6, params_dtype: ms.Type = ms.float32):
        super().__init__()
        self.weight = Parameter(zeros_tensor((dim,), params_dtype), name="weight")
        self.eps = eps

    def construct(self, x):
        return rms_norm_forward(self, self.weight, x)


class LayerNorm(nn.Cell):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis (GPT-2's norms)."""

    def __init__(self, dim: int, eps: float = 1e-5, params_dtype: ms.Type = ms.float32):
        super().__init__()
        self.weight = Parameter(zeros_tensor((dim,), params_dtype), name="weight")
        self.bias = Parameter(zeros_tensor((dim,), params_dtype), name="bias")
        self.eps = eps

    def construct(self, x):
        return layer_norm_forward(self, self.weight, self.bias, x)


_SQRT_2_OVER_PI = float(np.sqrt(2.0 / np.pi))


def gelu_tanh(x):
    """GELU's tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): transformers'
    `gelu_new` / `gelu_pytorch_tanh` / `gelu_fast` (GPT-2)."""
    return 0.5 * x * (1.0 + ops.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))


def gelu_erf(x):
    """Exact GELU, 0.5 x (1 + erf(x / sqrt(2))): transformers' `gelu`."""
    return 0.5 * x * (1.0 + ops.erf(x * float(1 / np.sqrt(2.0))))


ACTIVATIONS = {"gelu_new": gelu_tanh, "gelu_pytorch_tanh": gelu_tanh, "gelu_fast": gelu_tanh, "gelu": gelu_erf,
               "relu": ops.relu}


class GeluFeedForward(nn.Cell):
    """GPT-2's MLP: w2(act(w1 x)) with biases; w1 = c_fc, w2 = c_proj; `activation` one of
    `ACTIVATIONS` (transformers' names)."""

    def __init__(self, dim: int, hidden_dim: int, activation: str = "gelu_new",
                 params_dtype: ms.Type = ms.float32, compute_dtype: ms.Type = ms.float32):
        super().__init__()
        self.w1 = Linear(dim, hidden_dim, True, params_dtype, compute_dtype)
        self.w2 = Linear(hidden_dim, dim, True, params_dtype, compute_dtype)
        self.act = ACTIVATIONS[activation]

    def construct(self, x):
        return self.w2(self.act(self.w1(x)))


class FeedForward(nn.Cell):
    """SwiGLU: w2(silu(w1 x) * w3 x); w1 = gate_proj, w3 = up_proj, w2 = down_proj."""

    def __init__(self, dim: int, hidden_dim: int, bias: bool = False,
                 params_dtype: ms.Type = ms.float32, compute_dtype: ms.Type = ms.float32):
        super().__init__()
        self.w1 = Linear(dim, hidden_dim, bias, params_dtype, compute_dtype)
        self.w2 = Linear(hidden_dim, dim, bias, params_dtype, compute_dtype)
        self.w3 = Linear(dim, hidden_dim, bias, params_dtype, compute_dtype)

    def construct(self, x):
        return self.w2(mint.nn.functional.silu(self.w1(x)) * self.w3(x))
