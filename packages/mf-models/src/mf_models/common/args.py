"""Hyper-parameters shared by every model, under Hugging Face config.json names.

An HF config.json dict builds a model as is; keys that do not change the math are accepted and
either used for what they mean here or checked (a value this code cannot honour is an error, never
silently dropped):

- used: `initializer_range` (init std), `pad_token_id` (zero row at init, padding in `generate`),
  `eos_token_id` and `use_cache` (defaults of `generate`), `max_position_embeddings` (rope scaling)
- checked: `hidden_act` must be silu, `attention_dropout` must be 0 (no dropout implemented),
  `rope_*` (see common/rope.py)
- bookkeeping of the checkpoint, not the model: `transformers_version`, `dtype`/`torch_dtype`
  (storage dtype of the HF files; mf uses `params_dtype`), `bos_token_id` (a tokenizer setting),
  `pretraining_tp` (HF's sliced-matmul switch, mathematically equivalent)

mf extras: `seq_length` (training sequence length; default of `num_flops_per_token`),
`compute_dtype`, `params_dtype` (float32 | float16 | bfloat16), `use_flash_attention`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from typing import Any

from ..errors import ModelConfigError, did_you_mean
from .rope_settings import normalize_rope

DTYPE_NAMES = ("float32", "float16", "bfloat16")
_PY_TYPES = {"int": int, "float": (int, float), "bool": bool, "str": str, "dict": dict, "list": list}


@dataclass
class BaseArgs:
    # Class attribute (not a field): the default fraction of each head a partially rotating model
    # rotates (GLM-4's 0.5); None: whole heads (rope.py's `partial_rotary_factor` refused).
    partial_rotary_default = None

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    rope_parameters: dict | None = None
    rope_scaling: dict | None = None
    rope_theta: float | None = None
    initializer_range: float = 0.02
    attention_dropout: float = 0.0
    # bookkeeping keys of HF config.json (see module docstring)
    bos_token_id: int | list | None = None
    eos_token_id: int | list | None = None
    pad_token_id: int | None = None
    use_cache: bool = True
    dtype: str | None = None
    torch_dtype: str | None = None
    transformers_version: str | None = None
    pretraining_tp: int = 1
    # mf extras
    seq_length: int | None = None
    compute_dtype: str = "float32"
    params_dtype: str = "float32"
    use_flash_attention: bool = False

    def __post_init__(self) -> None:
        self._check_types()
        self.validate()

    # -- validation ---------------------------------------------------------------------------
    def _check_types(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            allowed = [t.strip() for t in str(f.type).split("|")]
            if value is None and "None" in allowed:
                continue
            ok = any(
                isinstance(value, _PY_TYPES[t]) and not (t in ("int", "float") and isinstance(value, bool))
                for t in allowed if t in _PY_TYPES
            )
            if not ok:
                raise ModelConfigError(f"model.{f.name}: expected {f.type}, got {value!r}")

    def _positive(self, *names: str) -> None:
        for name in names:
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ModelConfigError(f"model.{name}: must be positive, got {value!r}")
            if value is not None and not math.isfinite(value):   # NaN compares False to 0: asked apart
                raise ModelConfigError(f"model.{name}: must be a finite number, got {value!r}")

    def validate(self) -> None:
        self._positive("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                       "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
                       "rms_norm_eps", "initializer_range", "seq_length", "pretraining_tp")
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelConfigError(
                f"model.num_key_value_heads: {self.num_key_value_heads} must divide "
                f"num_attention_heads={self.num_attention_heads}")
        if self.hidden_act != "silu":
            raise ModelConfigError(f"model.hidden_act: only 'silu' (SwiGLU) is implemented, got {self.hidden_act!r}")
        if self.attention_dropout != 0:
            raise ModelConfigError(
                f"model.attention_dropout: attention dropout is not implemented; must be 0.0, got {self.attention_dropout!r}")
        for name in ("compute_dtype", "params_dtype"):
            value = getattr(self, name)
            if value not in DTYPE_NAMES:
                raise ModelConfigError(
                    f"model.{name}: unknown dtype {value!r};{did_you_mean(value, DTYPE_NAMES)} "
                    f"accepted: {', '.join(DTYPE_NAMES)}")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            raise ModelConfigError(f"model.pad_token_id: {self.pad_token_id} is outside the vocabulary [0, {self.vocab_size})")
        self.rope = normalize_rope(self.rope_parameters, self.rope_scaling, self.rope_theta,
                                   partial_rotary=self.partial_rotary_default,
                                   legacy_partial=getattr(self, "partial_rotary_factor", None))

    # -- helpers ------------------------------------------------------------------------------
    @property
    def eos_token_ids(self) -> list[int]:
        if self.eos_token_id is None:
            return []
        return list(self.eos_token_id) if isinstance(self.eos_token_id, list) else [self.eos_token_id]

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def accepted_keys(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_section(cls, section: dict[str, Any], what: str) -> BaseArgs:
        """Build from a `model` mapping (without model_type/architectures); unknown keys are one error."""
        accepted = cls.accepted_keys()
        for key in section:
            if key not in accepted:
                raise ModelConfigError(
                    f"model.{key}: unknown key for {what};{did_you_mean(str(key), accepted)} "
                    f"accepted keys: {', '.join(accepted)}")
        return cls(**section)

    def replace(self, **changes: Any) -> BaseArgs:
        return dataclasses.replace(self, **changes)

    def tensor_parallel_split(self) -> tuple[tuple[int, int | None], dict[str, int]]:
        """What tensor parallelism splits: ((attention heads, key/value heads), {model key: size}).
        A model whose plan splits other dimensions overrides this (common/layout.py checks it)."""
        return ((self.num_attention_heads, self.num_key_value_heads),
                {"vocab_size": self.vocab_size, "intermediate_size": self.intermediate_size})

    def training_problems(self) -> list[str]:
        """Keyed lines on what this model cannot train as configured although it runs inference
        (GPT-2's dropout): the trainer's preflight refuses them."""
        return []

    def balance_loss_key(self) -> str | None:
        """The model key that switches on a MoE balance loss when it is on (None: no balance loss)."""
        return None

    def is_moe_layer(self, i: int) -> bool:
        """Whether decoder layer `i` has a routed MoE (dense models: never)."""
        return False

    def moe_sizes(self) -> tuple[int, int, int, int] | None:
        """(routed experts, experts per token, an expert's intermediate size, the shared experts'
        total intermediate size) of the MoE layers, from the arguments alone (the inventory sizes the
        experts with it); None: a dense model."""
        return None

    def moe_layer_ids(self) -> list[int]:
        """The decoder layers with a routed MoE, from the arguments alone (no MindSpore): the rows of
        `forward_train`'s routing statistics, and what the trainer's preflight checks
        `monitor.moe_monitor.target_layers` against."""
        return [i for i in range(self.num_hidden_layers) if self.is_moe_layer(i)]

    def expert_bias_rate(self) -> float:
        """The rate of the aux-loss-free expert-bias update after each optimizer step (0: the
        model's routers have no bias, or the update is switched off)."""
        return 0.0


def default_head_dim(args: BaseArgs) -> None:
    """GQA models: head_dim defaults to hidden_size / num_attention_heads and must be even (RoPE)."""
    if args.head_dim is None:
        if args.hidden_size % args.num_attention_heads:
            raise ModelConfigError(
                f"model.hidden_size: {args.hidden_size} is not divisible by num_attention_heads="
                f"{args.num_attention_heads}; set head_dim explicitly")
        args.head_dim = args.hidden_size // args.num_attention_heads
    if args.head_dim % 2:
        raise ModelConfigError(f"model.head_dim: rotary embedding needs an even head_dim, got {args.head_dim}")


def check_full_attention(args: BaseArgs, derived_sliding: list[bool] | None = None) -> None:
    """Sliding-window attention is not implemented: refuse any layer HF would run with a window.

    `layer_types` (transformers 5) names each layer's kind; without it, `derived_sliding` (the
    model's own rule, e.g. Qwen2's `use_sliding_window and i >= max_window_layers`) does.
    """
    layer_types = getattr(args, "layer_types", None)
    if layer_types is not None:
        if len(layer_types) != args.num_hidden_layers:
            raise ModelConfigError(
                f"model.layer_types: {len(layer_types)} entries for num_hidden_layers={args.num_hidden_layers}")
        for i, kind in enumerate(layer_types):
            if kind != "full_attention":
                raise ModelConfigError(f"model.layer_types[{i}]: only 'full_attention' is implemented "
                                       f"(sliding-window attention is not), got {kind!r}")
        return
    for i, sliding in enumerate(derived_sliding or []):
        if sliding:
            raise ModelConfigError(f"model.use_sliding_window: layer {i} would use sliding-window attention, "
                                   f"which is not implemented; set use_sliding_window: false")
