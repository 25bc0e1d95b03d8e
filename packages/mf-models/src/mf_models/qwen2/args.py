"""Qwen2 hyper-parameters (HF `Qwen2Config` names; defaults are HF's)."""

from __future__ import annotations

from dataclasses import dataclass

from ..common.args import check_full_attention
from ..errors import ModelConfigError
from ..llama.args import LlamaArgs


@dataclass
class Qwen2Args(LlamaArgs):
    """Llama with biases on the query/key/value projections (never on o_proj or the MLP).

    Qwen2's config has no bias switches: `attention_bias` / `mlp_bias` (inherited names) must stay
    false. Sliding-window attention is not implemented: a layer HF would run with a window
    (`layer_types` entry "sliding_attention", or `use_sliding_window` with layer index >=
    `max_window_layers`) is refused; otherwise `sliding_window` / `max_window_layers` are unused by
    HF too and accepted as `save_pretrained` writes them.
    """

    vocab_size: int = 151936
    intermediate_size: int = 22016
    max_position_embeddings: int = 32768
    use_sliding_window: bool = False
    sliding_window: int | None = 4096
    max_window_layers: int = 28
    layer_types: list | None = None

    def validate(self) -> None:
        super().validate()
        for name in ("attention_bias", "mlp_bias"):
            if getattr(self, name):
                raise ModelConfigError(f"model.{name}: Qwen2's biases are fixed (q/k/v projections biased, o_proj "
                                       f"and the MLP not); remove the key")
        self.qkv_bias, self.o_bias = True, False
        check_full_attention(self, [self.use_sliding_window and self.sliding_window is not None
                                    and i >= self.max_window_layers for i in range(self.num_hidden_layers)])
