"""Tiny `model` sections of every registered architecture, for tests, demos and other packages'
tests (a few thousand parameters; build in milliseconds, compile in seconds).

A model's preset is `TINY_SIZES` with its spec's `tiny` keys laid over (`<model>/spec.py`)."""

from __future__ import annotations

from typing import Any

from .registry import available_models, resolve_spec

TINY_SIZES: dict[str, Any] = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                  num_attention_heads=4, max_position_embeddings=64, initializer_range=0.2)


def _with_preset() -> list[str]:
    return [t for t in available_models() if resolve_spec(t).tiny is not None]


def tiny_model_section(model_type: str, **overrides: Any) -> dict[str, Any]:
    """A fresh tiny `model` mapping for `model_type`, with `overrides` applied."""
    if model_type not in _with_preset():
        raise KeyError(f"no tiny preset for {model_type!r}; available: {', '.join(_with_preset())}")
    return {"model_type": model_type, **TINY_SIZES, **resolve_spec(model_type).tiny, **overrides}
