"""GPT-2 (GPT2LMHeadModel) <-> mf names.

transformers' GPT-2 stores its projections as Conv1D weights [in, out] (the transpose of
nn.Linear's [out, in]) and packs the query, key and value projections into one `attn.c_attn`
tensor [H, 3H] (bias [3H]): mf keeps every weight [out, in], with separate wq/wk/wv, so the rules
transpose (`transpose=True`) and unpack (`Packed`) on the way in and pack them back on the way out.
Learned positions (`wpe`) are mf's `pos_embeddings`; LayerNorms carry a bias. The head is tied to
`wte` unless config.json says `tie_word_embeddings: false` (then `lm_head.weight` exists).
Checkpoints saved from the base model (openai-community/gpt2) name their tensors without the
`transformer.` prefix and carry the causal-mask buffers `attn.bias` / `attn.masked_bias`: read
too (the buffers skipped), always written in transformers' layout.
"""

from __future__ import annotations

from ...errors import CheckpointError
from ..rules import Architecture, ConfigView, Packed, Rule

# transformers' GPT2Config defaults for keys a config.json may omit.
DEFAULTS = {"tie_word_embeddings": True, "n_inner": None}

TOP = (
    Rule("tok_embeddings.weight", "transformer.wte.weight", ("V", "H")),
    Rule("pos_embeddings.weight", "transformer.wpe.weight", ("P", "H")),
    Rule("norm.weight", "transformer.ln_f.weight", ("H",)),
    Rule("norm.bias", "transformer.ln_f.bias", ("H",)),
    Rule("output.weight", "lm_head.weight", ("V", "H"), when=("untied",)),
)

LAYER = (
    Rule("attention_norm.weight", "ln_1.weight", ("H",)),
    Rule("attention_norm.bias", "ln_1.bias", ("H",)),
    Rule("attention.wo.weight", "attn.c_proj.weight", ("H", "H"), transpose=True),
    Rule("attention.wo.bias", "attn.c_proj.bias", ("H",)),
    Rule("ffn_norm.weight", "ln_2.weight", ("H",)),
    Rule("ffn_norm.bias", "ln_2.bias", ("H",)),
    Rule("feed_forward.w1.weight", "mlp.c_fc.weight", ("I", "H"), transpose=True),
    Rule("feed_forward.w1.bias", "mlp.c_fc.bias", ("I",)),
    Rule("feed_forward.w2.weight", "mlp.c_proj.weight", ("H", "I"), transpose=True),
    Rule("feed_forward.w2.bias", "mlp.c_proj.bias", ("H",)),
)

PACKED = (
    Packed("attn.c_attn.weight", tuple(Rule(f"attention.{w}.weight", "", ("H", "H"), transpose=True)
                                       for w in ("wq", "wk", "wv")), axis=1),
    Packed("attn.c_attn.bias", tuple(Rule(f"attention.{w}.bias", "", ("H",)) for w in ("wq", "wk", "wv")), axis=0),
)


def _hf_key(c: ConfigView, gpt2: str, alias: str, nullable: bool = False) -> int | None:
    """GPT-2's own key (n_embd) or its alias (hidden_size); both must agree."""
    values = {k: c.raw[k] for k in (gpt2, alias) if c.raw.get(k) is not None}
    if len(set(map(repr, values.values()))) > 1:
        raise CheckpointError(f"config.json (gpt2): {gpt2} and {alias} disagree: {values}")
    return c.int(next(iter(values), gpt2), nullable=nullable)


def dims(c: ConfigView) -> dict[str, int]:
    hidden = _hf_key(c, "n_embd", "hidden_size")
    # mf-models takes intermediate_size as n_inner's alias (its tiny presets and mf's own configs
    # size every model with it); transformers reads n_inner only: given intermediate_size alone,
    # it builds 4 n_embd and refuses a checkpoint of another width (loudly, by its shape check).
    inner = _hf_key(c, "n_inner", "intermediate_size", nullable=True)
    return {"V": c.int("vocab_size"), "H": hidden, "P": _hf_key(c, "n_positions", "max_position_embeddings"),
            "I": inner if inner is not None else 4 * hidden}


def conditions(c: ConfigView) -> dict[str, bool]:
    if c.raw.get("add_cross_attention"):
        raise CheckpointError("config.json (gpt2): add_cross_attention (an encoder-decoder GPT-2) is not supported")
    return {"untied": not c.bool("tie_word_embeddings")}


def skipped(c: ConfigView):
    # Old checkpoints carry the causal-mask buffers of each attention (no weights).
    return lambda name: name.endswith((".attn.bias", ".attn.masked_bias"))


ARCH = Architecture(
    model_type="gpt2",
    hf_class="GPT2LMHeadModel",
    defaults=DEFAULTS,
    dims=dims,
    num_layers=lambda c: _hf_key(c, "n_layer", "num_hidden_layers"),
    conditions=conditions,
    layer_conditions=lambda c, i: {},
    top=TOP,
    layer=LAYER,
    packed=PACKED,
    skipped=skipped,
    hf_layer="transformer.h.{i}.",
    optional_prefix="transformer.",
)
