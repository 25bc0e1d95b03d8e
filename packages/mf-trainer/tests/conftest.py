"""Fixtures of the mf-trainer tests: MindSpore execution mode and a toy language model."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops


def torch_adamw_reference(params, grads_per_step, lrs, betas, eps, weight_decay, decay):
    """torch.optim.AdamW's update written out in numpy: float32 tensors, float64 host scalars."""
    beta1, beta2 = betas
    params = [p.astype(np.float32).copy() for p in params]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    for t, (grads, lr) in enumerate(zip(grads_per_step, lrs), start=1):
        for i, g in enumerate(grads):
            if decay[i]:
                params[i] = params[i] * np.float32(1 - lr * weight_decay)
            m[i] = m[i] + (g - m[i]) * np.float32(1 - beta1)  # lerp
            v[i] = v[i] * np.float32(beta2) + g * g * np.float32(1 - beta2)
            step_size = lr / (1 - beta1 ** t)
            bc2_sqrt = (1 - beta2 ** t) ** 0.5
            denom = np.sqrt(v[i]) / np.float32(bc2_sqrt) + np.float32(eps)
            params[i] = params[i] - np.float32(step_size) * (m[i] / denom)
    return params, m, v


@pytest.fixture(name="torch_adamw_reference")
def _torch_adamw_reference_fixture():
    return torch_adamw_reference


@pytest.fixture
def graph_mode():
    ms.set_context(mode=ms.GRAPH_MODE)
    yield
    ms.set_context(mode=ms.PYNATIVE_MODE)


class ToyLM(nn.Cell):
    """Embedding -> dense(+bias) -> tanh -> output head: enough to exercise every step path."""

    def __init__(self, vocab: int = 50, hidden: int = 16):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, hidden)
        self.proj = nn.Dense(hidden, hidden)
        self.output = nn.Dense(hidden, vocab, has_bias=False)

    def construct(self, input_ids):
        return self.output(ops.tanh(self.proj(self.tok_embeddings(input_ids))))


@pytest.fixture
def toy_lm():
    def make(seed: int = 0, vocab: int = 50, hidden: int = 16) -> ToyLM:
        ms.set_seed(seed)
        np.random.seed(seed)
        return ToyLM(vocab, hidden)

    return make
