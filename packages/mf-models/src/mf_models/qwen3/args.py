"""Qwen3 hyper-parameters (HF `Qwen3Config` names; defaults are HF's)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ModelConfigError
from ..llama.args import LlamaArgs


@dataclass
class Qwen3Args(LlamaArgs):
    """Llama plus per-head q/k RMSNorm and an explicit head_dim.

    Sliding-window attention is not implemented: `use_sliding_window` must be false and
    `layer_types` all "full_attention"; `sliding_window` / `max_window_layers` are then unused by
    HF too, so they are accepted as written by `save_pretrained`.
    """

    vocab_size: int = 151936
    intermediate_size: int = 22016
    head_dim: int | None = 128
    max_position_embeddings: int = 32768
    use_sliding_window: bool = False
    sliding_window: int | None = None
    max_window_layers: int | None = None
    layer_types: list | None = None

    def validate(self) -> None:
        super().validate()
        if self.use_sliding_window:
            raise ModelConfigError("model.use_sliding_window: sliding-window attention is not implemented; set false")
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_hidden_layers:
                raise ModelConfigError(
                    f"model.layer_types: {len(self.layer_types)} entries for num_hidden_layers={self.num_hidden_layers}")
            for i, kind in enumerate(self.layer_types):
                if kind != "full_attention":
                    raise ModelConfigError(
                        f"model.layer_types[{i}]: only 'full_attention' is implemented, got {kind!r}")
