"""Every parameter of a model and how tensor parallelism splits it, from the model's arguments alone.

    entries = mf_models.parameter_inventory(args)      # [ParamEntry(name, shape, tp_axis), ...]

Free of MindSpore on purpose: `mf plan` sizes an 8B or 70B layout from a YAML, where building the
model would allocate every weight. The names, shapes and order are the ones `build_model` creates
(`parameters_and_names()`), and `tp_axis` is the axis the model's `parallelize.py` plan reslices
(ColwiseParallel: rows of W [out, in] and its bias; RowwiseParallel: columns of W, bias replicated;
VocabParallelEmbedding: vocabulary rows; norms replicated). The tests build every covered model
and compare, and compare the axes with the plan applied on tensor-parallel ranks, so the two cannot
drift apart silently.

Covered: the dense decoders sharing llama's plan (llama, qwen2, qwen3). MoE and MLA models raise
ModelConfigError naming the model type (their expert and latent layouts are not tabulated yet).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ModelConfigError

DENSE_TYPES = ("llama", "qwen2", "qwen3")


@dataclass(frozen=True)
class ParamEntry:
    """One parameter: global name and shape, and the axis tensor parallelism splits (None: replicated)."""

    name: str
    shape: tuple[int, ...]
    tp_axis: int | None

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def _linear(prefix: str, d_in: int, d_out: int, bias: bool, style: str) -> list[ParamEntry]:
    # W is [out, in] (mf_models.common.layers.Linear, torch's convention).
    out = [ParamEntry(prefix + ".weight", (d_out, d_in), 0 if style == "col" else 1)]
    if bias:
        out.append(ParamEntry(prefix + ".bias", (d_out,), 0 if style == "col" else None))
    return out


def _model_type(args) -> str:
    from .. import registry

    for spec in registry._BY_TYPE.values():   # the registry's own table: same package
        if type(args) is spec.args_cls:
            return spec.model_type
    raise ModelConfigError(f"model: no registered model for arguments of type {type(args).__name__}")


def parameter_inventory(args) -> list[ParamEntry]:
    """The parameters `build_model` makes for `args` (validated args, e.g. from `build_args`)."""
    kind = _model_type(args)
    if kind not in DENSE_TYPES:
        raise ModelConfigError(f"model.model_type: the parameter inventory of {kind} (MoE / latent attention) is not "
                               f"tabulated yet; covered: {', '.join(DENSE_TYPES)}")
    h, hd = args.hidden_size, args.head_dim
    q, kv, f = args.num_attention_heads * hd, (args.num_key_value_heads or args.num_attention_heads) * hd, \
        args.intermediate_size
    qkv_bias, o_bias, mlp_bias = args.qkv_bias, args.o_bias, getattr(args, "mlp_bias", False)
    out = [ParamEntry("tok_embeddings.weight", (args.vocab_size, h), 0)]
    for i in range(args.num_hidden_layers):
        p = f"layers.{i}"
        out.append(ParamEntry(p + ".attention_norm.weight", (h,), None))
        out += _linear(p + ".attention.wq", h, q, qkv_bias, "col")
        out += _linear(p + ".attention.wk", h, kv, qkv_bias, "col")
        out += _linear(p + ".attention.wv", h, kv, qkv_bias, "col")
        out += _linear(p + ".attention.wo", q, h, o_bias, "row")
        if kind == "qwen3":
            out += [ParamEntry(p + ".attention.q_norm.weight", (hd,), None),
                    ParamEntry(p + ".attention.k_norm.weight", (hd,), None)]
        out.append(ParamEntry(p + ".ffn_norm.weight", (h,), None))
        out += _linear(p + ".feed_forward.w1", h, f, mlp_bias, "col")
        out += _linear(p + ".feed_forward.w2", f, h, mlp_bias, "row")
        out += _linear(p + ".feed_forward.w3", h, f, mlp_bias, "col")
    out.append(ParamEntry("norm.weight", (h,), None))
    if not args.tie_word_embeddings:
        out.append(ParamEntry("output.weight", (args.vocab_size, h), 0))
    return out


def saved_activations(args, seq: int, tp: int = 1, *, fused_attention: bool = False) -> dict[str, int]:
    """Elements one sample (a sequence of `seq` tokens) keeps alive from forward to backward, per
    module of one decoder layer and for the model's ends, on one of `tp` tensor-parallel ranks
    (sequence parallelism: norms and residuals hold seq/tp tokens, the projections hold every
    token but 1/tp of the features).

    Keys: "attention_norm", "attention", "ffn_norm", "feed_forward" (one layer; summed they are the
    layer) and "head" (final norm, logits and the loss's log-probabilities: once per model). The
    terms are the tensors our plain-math implementation hands to backward (mf_models' attention
    without the fused kernel, which CPU lacks): each norm's input and its normalised output; the
    projections' shared input; q, k, v after RoPE, their pre-RoPE copies and rotate_half's
    output (the rotation's two products keep both operands); the GQA-repeated k, v; three
    [heads, seq, seq] tensors: the raw scores (kept by the scaling product), the scaled masked
    scores and the softmax probabilities; the attention output; SwiGLU's two projections, the SiLU
    and the product. `fused_attention` (Ascend's flash attention kernel, `use_flash_attention`) keeps
    the softmax statistics per head and token instead of the two [heads, seq, seq] tensors.
    """
    kind = _model_type(args)
    if kind not in DENSE_TYPES:
        raise ModelConfigError(f"model.model_type: the activation inventory of {kind} is not tabulated yet; covered: "
                               f"{', '.join(DENSE_TYPES)}")
    h, hd = args.hidden_size, args.head_dim
    heads, kv_heads = args.num_attention_heads, args.num_key_value_heads or args.num_attention_heads
    q, kv = heads * hd // tp, kv_heads * hd // tp
    shard = -(-seq // tp)                              # tokens of a sequence-parallel shard
    repeat = 2 * seq * q if kv_heads != heads else 0   # repeat_kv materialises k and v at q's width
    qk_norm = seq * (q + kv) if kind == "qwen3" else 0
    scores = (heads // tp) * seq * (2 if fused_attention else 3 * seq)
    norm = shard * h + seq * h                          # input shard, gathered normalised output
    return {
        "attention_norm": norm,
        "attention": seq * (3 * (q + kv) + kv) + repeat + qk_norm + scores + seq * q,
        "ffn_norm": norm,
        "feed_forward": 4 * seq * (args.intermediate_size // tp),
        "head": shard * h + seq * h + 2 * seq * (args.vocab_size // tp),
    }
