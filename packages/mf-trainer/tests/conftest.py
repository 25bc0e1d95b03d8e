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


def write_tiny_corpus(prefix: str, documents: int = 60, vocab: int = 64) -> str:
    """Megatron .bin/.idx written with mf-data's builder: arithmetic token runs a model can learn,
    each document ended by the EOD id 1."""
    import mf_data

    rng = np.random.RandomState(0)
    builder = mf_data.IndexedDatasetBuilder(mf_data.get_bin_path(prefix), dtype=np.uint16)
    for _ in range(documents):
        start, length = rng.randint(0, vocab - 3), rng.randint(40, 120)
        doc = (start + np.arange(length) * 3) % (vocab - 3) + 2
        builder.add_item(np.append(doc, 1).astype(np.uint16))
        builder.end_document()
    builder.finalize(mf_data.get_idx_path(prefix))
    return prefix


def tiny_config(output_dir, data_prefix, **sections) -> dict:
    """A complete training YAML (as a mapping) for a 2-layer llama with hidden size 32."""
    cfg = {
        "output_dir": str(output_dir),
        "context": {"mode": 0},
        "checkpoint": {"save_interleaved_steps": 3, "save_max": 2},
        "training": {"steps": 6, "local_batch_size": 2, "global_batch_size": 4, "seed": 7,
                     "max_consecutive_nonfinite": 2},
        "optimizer": {"type": "AdamW", "weight_decay": 0.01},
        "lr_scheduler": {"type": "CosineWithWarmUpLR", "learning_rate": 3e-3, "warmup_steps": 2, "lr_end": 1e-4},
        "train_dataset": {
            "dataloader": {
                "type": "BlendedMegatronDatasetDataLoader", "datasets_type": "GPTDataset", "sizes": [200, 0, 0],
                "column_names": ["input_ids", "labels", "loss_mask", "position_ids"],
                "config": {"seq_length": 32, "split": "1,0,0", "eod": 1, "pad": 0, "create_attention_mask": False,
                           "data_path": ["1", str(data_prefix)]},
            },
            "num_parallel_workers": 1,
        },
        "model": {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
                  "num_hidden_layers": 2, "num_attention_heads": 2, "max_position_embeddings": 64},
        "monitor": {"log_interval": 1, "peak_flops_per_device": 1.0e11},
    }
    for name, value in sections.items():
        if isinstance(value, dict) and isinstance(cfg.get(name), dict):
            cfg[name] = {**cfg[name], **value}
        else:
            cfg[name] = value
    return cfg


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory):
    return write_tiny_corpus(str(tmp_path_factory.mktemp("corpus") / "toy_text_document"))


@pytest.fixture(scope="session", name="tiny_config")
def _tiny_config_fixture():
    return tiny_config
