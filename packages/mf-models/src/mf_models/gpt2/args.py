"""GPT-2 hyper-parameters (HF `GPT2Config` names; defaults are HF's)."""

from __future__ import annotations

from dataclasses import dataclass

from ..common.args import BaseArgs
from ..errors import ModelConfigError

# transformers' names of the activations implemented (common/layers.py ACTIVATIONS)
ACTIVATION_NAMES = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu", "relu")

# GPT-2's own key -> the transformers alias BaseArgs uses (GPT2Config.attribute_map)
ALIASES = {"n_embd": "hidden_size", "n_layer": "num_hidden_layers", "n_head": "num_attention_heads",
           "n_positions": "max_position_embeddings", "n_inner": "intermediate_size"}
_GPT2_DEFAULTS = {"n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024}


@dataclass
class Gpt2Args(BaseArgs):
    """Learned positions (`wpe`), pre-LayerNorm blocks (`layer_norm_epsilon`), multi-head attention
    with biases on every projection, a GELU MLP of `n_inner` (default 4 n_embd) with biases, the
    head tied to the token embedding (`tie_word_embeddings`, transformers' default true).

    GPT-2's keys (`n_embd`, `n_layer`, `n_head`, `n_positions`, `n_inner`) and their transformers
    aliases (`hidden_size`, ...) are both accepted and must agree. `activation_function` is one of
    transformers' gelu_new (GPT-2's), gelu_pytorch_tanh, gelu_fast (the same tanh approximation),
    gelu (erf) or relu. `scale_attn_weights: false` drops the 1/sqrt(head_dim) scale and
    `scale_attn_by_inverse_layer_idx` divides it by the layer number, as HF does;
    `reorder_and_upcast_attn` (scores and softmax in float32) is what mf does in float32 and is
    refused for half-precision compute, where mf's scores matmul would not be upcast.
    Dropout (`resid_pdrop`, `embd_pdrop`, `attn_pdrop`; HF's default 0.1) is not implemented: any
    value is accepted for inference, where HF applies none either, and training refuses a
    non-zero one (`training_problems`). `summary_*` configure transformers' double-heads model,
    not the causal LM (accepted as config.json carries them); `add_cross_attention` is refused.
    """

    vocab_size: int = 50257
    hidden_size: int | None = None
    intermediate_size: int | None = None
    num_hidden_layers: int | None = None
    num_attention_heads: int | None = None
    max_position_embeddings: int | None = None
    tie_word_embeddings: bool = True
    bos_token_id: int | list | None = 50256
    eos_token_id: int | list | None = 50256
    n_embd: int | None = None
    n_layer: int | None = None
    n_head: int | None = None
    n_positions: int | None = None
    n_inner: int | None = None
    activation_function: str = "gelu_new"
    layer_norm_epsilon: float = 1e-5
    resid_pdrop: float = 0.1
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    scale_attn_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    reorder_and_upcast_attn: bool = False
    add_cross_attention: bool = False
    summary_type: str | None = None
    summary_use_proj: bool | None = None
    summary_activation: str | None = None
    summary_proj_to_labels: bool | None = None
    summary_first_dropout: float | None = None
    summary_last_dropout: float | None = None

    def validate(self) -> None:
        for gpt2, alias in ALIASES.items():
            mine, theirs = getattr(self, gpt2), getattr(self, alias)
            if mine is not None and theirs is not None and mine != theirs:
                raise ModelConfigError(f"model.{gpt2}: {mine!r} contradicts {alias}={theirs!r} (one name for the "
                                       f"same size; give one of them)")
            value = mine if mine is not None else theirs
            if value is None and gpt2 in _GPT2_DEFAULTS:
                value = _GPT2_DEFAULTS[gpt2]
            setattr(self, gpt2, value)
            setattr(self, alias, value)
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size
        super().validate()
        self._positive("layer_norm_epsilon")
        if self.hidden_size % self.num_attention_heads:
            raise ModelConfigError(f"model.n_embd: {self.hidden_size} is not divisible by n_head="
                                   f"{self.num_attention_heads}")
        self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_key_value_heads != self.num_attention_heads:
            raise ModelConfigError(f"model.num_key_value_heads: GPT-2 attention has one key per head; must equal "
                                   f"n_head={self.num_attention_heads}, got {self.num_key_value_heads}")
        if self.activation_function not in ACTIVATION_NAMES:
            raise ModelConfigError(f"model.activation_function: {self.activation_function!r} is not implemented; "
                                   f"one of {', '.join(ACTIVATION_NAMES)}")
        if self.add_cross_attention:
            raise ModelConfigError("model.add_cross_attention: GPT-2 with cross-attention (an encoder-decoder "
                                   "decoder) is not supported; set false")
        if self.reorder_and_upcast_attn and self.compute_dtype != "float32":
            raise ModelConfigError(f"model.reorder_and_upcast_attn: scores in float32 under compute_dtype "
                                   f"{self.compute_dtype} are not implemented; set false or compute_dtype float32")
        for name in ("resid_pdrop", "embd_pdrop", "attn_pdrop"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ModelConfigError(f"model.{name}: must be in [0, 1), got {getattr(self, name)!r}")
        self.qkv_bias = self.o_bias = True

    def training_problems(self) -> list[str]:
        return [f"model.{name}: dropout {getattr(self, name)} is not implemented; set {name}: 0.0 to train "
                f"without it (inference applies none, as in transformers)"
                for name in ("resid_pdrop", "embd_pdrop", "attn_pdrop") if getattr(self, name) > 0]

    def tensor_parallel_split(self) -> tuple[tuple[int, int | None], dict[str, int]]:
        # The position table is split by rows like the vocabulary (a vocab-parallel lookup).
        return ((self.num_attention_heads, self.num_key_value_heads),
                {"vocab_size": self.vocab_size, "n_inner": self.intermediate_size,
                 "n_positions": self.max_position_embeddings})
