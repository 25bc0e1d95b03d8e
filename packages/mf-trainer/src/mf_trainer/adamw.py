"""AdamW with PyTorch's semantics, as a MindSpore Cell that compiles inside a GRAPH_MODE step.

The update is `torch.optim.AdamW`'s:

    p   <- p * (1 - lr * wd)                      (decoupled decay; 0 for no-decay params)
    m   <- beta1 * m + (1 - beta1) * g
    v   <- beta2 * v + (1 - beta2) * g * g
    p   <- p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

Why not a MindSpore optimizer class: `mint.optim.AdamW` and `FusedAdamW` have no CPU kernel,
`nn.AdamWeightDecay` has no bias correction, and `mindspore.experimental.optim.AdamW` keeps its
step counter and an unused `max_exp_avg_sq` copy of every parameter inside the graph and compiles
an element-wise chain per parameter. Here the fused `ops.AdamWeightDecay` kernel (CPU and Ascend)
does the arithmetic, with torch's bias corrections folded into its lr / eps / decay inputs (see
`scalars`); the tests check the result against a numpy transcription of torch's update.

The scalars that depend on the step `t` and the learning rate are computed on the host in double
precision, as torch does, and enter the compiled graph as 0-d float32 tensors. So a changing LR
never recompiles, and the step counter is plain Python state: saved and restored exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from mf_trainer.errors import TrainerConfigError


def checked_moments(state: dict, buffers) -> dict[str, np.ndarray]:
    """{key: float32 array} of `state` for every (key, buffer) of `buffers`, each present with its
    buffer's shape: an optimizer's `load_state_dict` checks them all before it writes any."""
    values = {}
    for key, buf in buffers:
        if key not in state:
            raise KeyError(f"optimizer state has no {key!r}")
        value = np.asarray(state[key], dtype=np.float32)
        if tuple(value.shape) != tuple(buf.shape):
            raise ValueError(f"optimizer state {key!r}: shape {value.shape} != {tuple(buf.shape)}")
        values[key] = value
    return values


class AdamW(nn.Cell):
    """`AdamW(params, betas, eps, weight_decay, decay)`; `decay[i]` says whether params[i] decays.

    Call pattern (inside or outside a compiled step)::

        scalars = opt.scalars(lr)          # host: 3 float32 0-d tensors for step t = opt.step + 1
        opt(grads, apply, *scalars)        # graph: updates params, exp_avg, exp_avg_sq in place
        opt.step += 1                      # host: only when `apply` (a bool tensor) was True
    """

    def __init__(
        self,
        params: Sequence[Parameter],
        betas: Sequence[float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        decay: Sequence[bool] | None = None,
    ):
        super().__init__(auto_prefix=False)
        betas = tuple(float(b) for b in betas)
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise TrainerConfigError(f"optimizer.betas: need two values in [0, 1), got {list(betas)}")
        if not eps > 0.0:
            raise TrainerConfigError(f"optimizer.eps: must be positive, got {eps}")
        if weight_decay < 0.0:
            raise TrainerConfigError(f"optimizer.weight_decay: must be >= 0, got {weight_decay}")
        params = list(params)
        decay = [True] * len(params) if decay is None else list(decay)
        if len(decay) != len(params):
            raise ValueError(f"decay has {len(decay)} entries for {len(params)} parameters")
        self.beta1, self.beta2 = betas
        self.eps = float(eps)
        self.weight_decay = float(weight_decay)
        # Python tuple of bools: a compile-time constant, so the graph holds no multiply for
        # parameters that do not decay.
        self.decay = tuple(bool(d) and self.weight_decay > 0.0 for d in decay)
        # Names as given: a parent Cell with auto_prefix may rename the Parameters later, and the
        # checkpoint keys must not depend on how the optimizer is wrapped.
        self.param_names = [p.name for p in params]
        self.params = ParameterTuple(params)
        self.exp_avg = self.params.clone(prefix="exp_avg", init="zeros")
        self.exp_avg_sq = self.params.clone(prefix="exp_avg_sq", init="zeros")
        self.step = 0  # number of updates applied so far (host state)
        self.hyper_map = ops.HyperMap()
        self.adamw_kernel = ops.AdamWeightDecay()

    # ---- host side -------------------------------------------------------------------------
    def scalars(self, lr: float) -> tuple[Tensor, Tensor, Tensor]:
        """(lr', eps', decay') for the next update t = step + 1, computed in double precision.

        The fused kernel computes p - lr' * (m / (sqrt(v) + eps') + decay' * p); with
        lr' = lr * sqrt(bc2) / bc1, eps' = eps * sqrt(bc2) and decay' = wd * bc1 / sqrt(bc2)
        that is exactly torch's p * (1 - lr * wd) - lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps).
        """
        return tuple(Tensor(np.float32(v)) for v in self.host_scalars(lr))

    def host_scalars(self, lr: float) -> tuple[float, float, float]:
        """`scalars` as Python floats (double precision)."""
        t = self.step + 1
        bc1 = 1.0 - self.beta1 ** t
        sqrt_bc2 = math.sqrt(1.0 - self.beta2 ** t)
        lr = float(lr)
        return lr * sqrt_bc2 / bc1, self.eps * sqrt_bc2, self.weight_decay * bc1 / sqrt_bc2

    def _moments(self):
        for prefix, moments in (("exp_avg", self.exp_avg), ("exp_avg_sq", self.exp_avg_sq)):
            for name, p in zip(self.param_names, moments):
                yield f"{prefix}.{name}", p

    def state_dict(self) -> dict:
        """Moments as numpy arrays keyed `exp_avg.<param>` / `exp_avg_sq.<param>`, plus `step`."""
        state: dict = {"step": self.step}
        for key, p in self._moments():
            state[key] = p.asnumpy().copy()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Inverse of `state_dict`; every moment is checked before any is written."""
        values = checked_moments(state, self._moments())
        for key, p in self._moments():
            p.set_data(Tensor(values[key]))
        self.step = int(state["step"])

    def moment_names(self) -> list[str]:
        return [key for key, _ in self._moments()]

    def moment_owners(self) -> list[tuple[str, Parameter]]:
        """(state key, the parameter it belongs to): checkpoints give a moment its parameter's layout."""
        return [(f"{prefix}.{name}", p) for prefix in ("exp_avg", "exp_avg_sq")
                for name, p in zip(self.param_names, self.params)]

    # ---- graph side ------------------------------------------------------------------------
    def construct(self, grads, apply, lr, eps, decay):
        """Update every parameter with MindSpore's fused AdamWeightDecay kernel.

        `scalars()` folds torch's bias corrections into the kernel's inputs, and with `apply`
        False (zero gradients from the caller) beta1 = beta2 = 1 and lr = 0 reproduce m, v and
        p exactly. A graph `if` around the update would double GRAPH_MODE compile time.
        """
        beta1 = ops.where(apply, self.beta1, 1.0)
        beta2 = ops.where(apply, self.beta2, 1.0)
        lr = ops.where(apply, lr, 0.0)
        update = ops.partial(_adamw_update, self.adamw_kernel, lr, beta1, beta2, eps, decay)
        return self.hyper_map(update, self.decay, self.params, grads, self.exp_avg, self.exp_avg_sq)


_adamw_update = ops.MultitypeFuncGraph("mf_adamw_update")


@_adamw_update.register("Function", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Bool",
                        "Tensor", "Tensor", "Tensor", "Tensor")
def _update_one(kernel, lr, beta1, beta2, eps, decay, decays, param, grad, exp_avg, exp_avg_sq):
    return kernel(param, exp_avg, exp_avg_sq, lr, beta1, beta2, eps, decay if decays else decay * 0.0, grad)


def build_adamw(named_params: Sequence[tuple[str, Parameter]], cfg) -> AdamW:
    """AdamW from the YAML `optimizer` section (type, betas, eps, weight_decay, include/exclude).

    `cfg` is mf_config's OptimizerConfig (or anything with those attributes); its pass-through
    extras must be empty, because AdamW takes no other keys.
    """
    from mf_trainer.optimizer_options import optimizer_options
    from mf_trainer.weight_decay import decay_mask

    if (getattr(cfg, "type", "AdamW") or "AdamW") != "AdamW":
        raise TrainerConfigError(f"optimizer.type: build_adamw builds AdamW, got {cfg.type!r} (use build_optimizer)")
    optimizer_options(cfg)
    names = [n for n, _ in named_params]
    mask = decay_mask(names, getattr(cfg, "weight_decay_include", None), getattr(cfg, "weight_decay_exclude", None))
    return AdamW(
        [p for _, p in named_params],
        betas=tuple(getattr(cfg, "betas", (0.9, 0.95))),
        eps=float(getattr(cfg, "eps", 1e-8)),
        weight_decay=float(getattr(cfg, "weight_decay", 0.01)),
        decay=mask,
    )


__all__ = ["AdamW", "build_adamw", "checked_moments"]
