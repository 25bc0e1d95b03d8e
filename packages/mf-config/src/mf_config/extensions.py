"""Sections mf adds to the reference's schema: evaluation data, LoRA, inference, tokenizer.

They are strict (unknown keys are errors), like the reference's own non-model sections: each is
consumed by mf's own code, so there is nothing to pass through.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from mf_config.errors import ConfigError
from mf_config.schema import Section, all_of, each, fld, in_range, non_empty, non_negative, positive
from mf_config.sections import TrainDatasetConfig, layer_specs


@dataclass(kw_only=True)
class EvalDatasetConfig(TrainDatasetConfig):
    """Evaluation data: the shape of `train_dataset` plus when and how much to evaluate."""

    eval_interval: int | None = fld(None, check=positive,
                                    doc="evaluate every N training steps; null = no periodic evaluation")
    eval_iters: int = fld(10, check=positive, doc="batches per evaluation")


def _regex(value: str, path: str) -> None:
    if not value:
        raise ConfigError(path, "must be a non-empty regular expression", value)
    try:
        re.compile(value)
    except re.error as exc:
        raise ConfigError(path, f"is not a valid regular expression ({exc})", value) from None


@dataclass(kw_only=True)
class LoraConfig(Section):
    """Low-rank adapters; present = LoRA is applied to the modules `target_modules` matches."""

    target_modules: str = fld(check=_regex, doc="regex over module names that get adapters (required)")
    exclude_layers: list[str] | None = fld(None, pre=layer_specs, doc="layer specs left without adapters")
    lora_rank: int = fld(8, check=positive, doc="adapter rank r")
    lora_alpha: float = fld(16.0, check=positive, doc="scaling numerator: the update is scaled by alpha / r")
    lora_dropout: float = fld(0.0, check=in_range(0.0, 1.0, high_open=True), doc="dropout on the adapter input")


@dataclass(kw_only=True)
class InferenceConfig(Section):
    """Text generation for run_mode predict."""

    max_new_tokens: int = fld(128, check=positive, doc="tokens generated per prompt at most")
    do_sample: bool = fld(False, doc="sample; False = greedy (temperature/top_k/top_p then unused)")
    temperature: float = fld(1.0, check=positive, doc="softmax temperature")
    top_k: int = fld(0, check=non_negative, doc="keep the k most likely tokens; 0 = off")
    top_p: float = fld(1.0, check=in_range(0.0, 1.0, low_open=True), doc="nucleus mass in (0, 1]; 1 = off")
    stop_token_ids: list[int] | None = fld(None, check=each(non_negative), doc="generation stops at these ids")
    batch_size: int = fld(1, check=positive, doc="prompts generated together")
    prompts: list[str] | None = fld(None, check=all_of(non_empty, each(non_empty)), doc="prompts to complete")
    input_file: str | None = fld(None, check=non_empty, doc="JSON Lines file of prompts, one {\"prompt\": ...} object per line")
    output_file: str | None = fld(None, check=non_empty, doc="JSON Lines file the generations are written to; null = stdout")


@dataclass(kw_only=True)
class TokenizerConfig(Section):
    """The tokenizer used for text in and out (prompts, generations, evaluation logs)."""

    path: str = fld("", doc="sentencepiece .model file or Hugging Face tokenizer directory")
    type: Literal["sentencepiece", "hf"] = fld("sentencepiece", doc="'sentencepiece' or 'hf'")
