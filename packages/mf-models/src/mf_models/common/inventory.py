"""Every parameter of a model and how tensor parallelism splits it, from the model's arguments alone.

    entries = mf_models.parameter_inventory(args)      # [ParamEntry(name, shape, tp_axis), ...]

Free of MindSpore on purpose: `mf plan` sizes an 8B or 70B layout from a YAML, where building the
model would allocate every weight. The names, shapes and order are the ones `build_model` creates
(`parameters_and_names()`), and `tp_axis` is the axis the model's `parallelize.py` plan reslices
(ColwiseParallel: rows of W [out, in] and its bias; RowwiseParallel: columns of W, bias replicated;
VocabParallelEmbedding: vocabulary rows; norms replicated). The tests build every covered model
and compare, and compare the axes with the plan applied on tensor-parallel ranks, so the two cannot
drift apart silently.

A model folder says how its tables are made in its spec (`inventory=`): `DecoderInventory` covers
the pre-norm decoders of this package, with Llama's GQA attention (llama, qwen2, qwen3 with its
per-head q/k norms, and the MoE models mixtral and qwen3_moe) or DeepSeek-V3's multi-head latent
attention (dense layers below first_k_dense_replace, routed + shared experts, the router's expert
bias). Whether a layer is MoE and how large its experts are come from the args class
(`is_moe_layer`, `moe_sizes`). Under tensor parallelism a MoE block is replicated on the rank's
sequence shard (its `parallelize.py`: `moe_plan`), so its parameters have no tp axis, and MLA's
latent projections (wq_a, q_norm, wkv_a, kv_norm) stay replicated too. A model of another shape
gives its own object with the same two methods.
"""

from __future__ import annotations

from dataclasses import dataclass

from .blocks import max_blocks, rows_per_block

ATTENTION_KINDS = ("gqa", "mla")


@dataclass(frozen=True)
class ParamEntry:
    """One parameter: global name and shape, and the axis tensor parallelism splits (None: replicated)."""

    name: str
    shape: tuple[int, ...]
    tp_axis: int | None
    trainable: bool = True     # False: no gradient, no optimizer state (DeepSeek's expert_bias)

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


def _swiglu(prefix: str, h: int, f: int, bias: bool, style: bool = True) -> list[ParamEntry]:
    """w1 (gate), w2 (down), w3 (up); `style` False: replicated (a MoE block's shared experts)."""
    out = _linear(prefix + ".w1", h, f, bias, "col") + _linear(prefix + ".w2", f, h, bias, "row") + \
        _linear(prefix + ".w3", h, f, bias, "col")
    return out if style else [ParamEntry(e.name, e.shape, None) for e in out]


def _gqa_attention(p: str, args, qk_norm: bool) -> list[ParamEntry]:
    h, hd = args.hidden_size, args.head_dim
    q, kv = args.num_attention_heads * hd, (args.num_key_value_heads or args.num_attention_heads) * hd
    qkv_bias, o_bias = args.qkv_bias, args.o_bias
    out = _linear(p + ".wq", h, q, qkv_bias, "col") + _linear(p + ".wk", h, kv, qkv_bias, "col")
    out += _linear(p + ".wv", h, kv, qkv_bias, "col") + _linear(p + ".wo", q, h, o_bias, "row")
    if qk_norm:
        out += [ParamEntry(p + ".q_norm.weight", (hd,), None), ParamEntry(p + ".k_norm.weight", (hd,), None)]
    return out


def _mla_attention(p: str, args) -> list[ParamEntry]:
    """DeepSeek-V3's MLA: the latent projections replicated, wq | wq_b and wkv_b by heads, wo by rows."""
    h, heads, rope = args.hidden_size, args.num_attention_heads, args.qk_rope_head_dim
    out = []
    if args.q_lora_rank is not None:
        out += [ParamEntry(p + ".wq_a.weight", (args.q_lora_rank, h), None),
                ParamEntry(p + ".q_norm.weight", (args.q_lora_rank,), None)]
        out += _linear(p + ".wq_b", args.q_lora_rank, heads * args.qk_head_dim, False, "col")
    else:
        out += _linear(p + ".wq", h, heads * args.qk_head_dim, False, "col")
    out += [ParamEntry(p + ".wkv_a.weight", (args.kv_lora_rank + rope, h), None),
            ParamEntry(p + ".kv_norm.weight", (args.kv_lora_rank,), None)]
    out += _linear(p + ".wkv_b", args.kv_lora_rank, heads * (args.qk_nope_head_dim + args.v_head_dim), False, "col")
    out += _linear(p + ".wo", heads * args.v_head_dim, h, False, "row")
    return out


def _moe(p: str, args, expert_bias: bool, shared_gate: bool) -> list[ParamEntry]:
    h = args.hidden_size
    e, _, f, shared = args.moe_sizes()
    out = [ParamEntry(p + ".router.expert_bias", (e,), None, False)] if expert_bias else []
    out += [ParamEntry(p + ".router.gate.weight", (e, h), None), ParamEntry(p + ".experts.w1", (e, f, h), None),
            ParamEntry(p + ".experts.w2", (e, h, f), None), ParamEntry(p + ".experts.w3", (e, f, h), None)]
    if shared:
        out += _swiglu(p + ".shared_experts", h, shared, False, style=False)
        if shared_gate:
            out.append(ParamEntry(p + ".shared_expert_gate.weight", (1, h), None))
    return out


@dataclass(frozen=True)
class DecoderInventory:
    """The tables of a pre-norm decoder (norm, attention, norm, SwiGLU MLP or MoE per layer; final
    norm and an output head unless tied) as this package builds them.

    `attention`: "gqa" (Llama's wq/wk/wv/wo, biases as the args' `qkv_bias` / `o_bias` say) or
    "mla" (DeepSeek-V3's latent attention); `qk_norm`: per-head q/k RMSNorms (Qwen3), or the name
    of the args field that says whether there are (GLM-4.5's `use_qk_norm`); `shared_gate`: the
    shared experts' output is scaled by a sigmoid gate [1, H] (Qwen2-MoE's `shared_expert_gate`);
    `expert_bias`: the MoE router carries DeepSeek's aux-loss-free `expert_bias` (not trained).
    """

    attention: str = "gqa"
    qk_norm: bool | str = False
    expert_bias: bool = False
    shared_gate: bool = False

    def has_qk_norm(self, args) -> bool:
        return bool(getattr(args, self.qk_norm)) if isinstance(self.qk_norm, str) else self.qk_norm

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"DecoderInventory.attention: {self.attention!r} is not one of {ATTENTION_KINDS}")

    def parameters(self, args) -> list[ParamEntry]:
        """The parameters `build_model` makes for `args`, in its order."""
        h = args.hidden_size
        out = [ParamEntry("tok_embeddings.weight", (args.vocab_size, h), 0)]
        for i in range(args.num_hidden_layers):
            p = f"layers.{i}"
            out.append(ParamEntry(p + ".attention_norm.weight", (h,), None))
            out += _mla_attention(p + ".attention", args) if self.attention == "mla" else \
                _gqa_attention(p + ".attention", args, self.has_qk_norm(args))
            out.append(ParamEntry(p + ".ffn_norm.weight", (h,), None))
            if args.is_moe_layer(i):
                out += _moe(p + ".moe", args, self.expert_bias, self.shared_gate)
            else:
                out += _swiglu(p + ".feed_forward", h, args.intermediate_size, getattr(args, "mlp_bias", False))
        out.append(ParamEntry("norm.weight", (h,), None))
        if not args.tie_word_embeddings:
            out.append(ParamEntry("output.weight", (args.vocab_size, h), 0))
        return out

    def activations(self, args, seq: int, tp: int = 1, *, fused_attention: bool = False, layer: int = 0
                    ) -> dict[str, int]:
        """Elements one sample (a sequence of `seq` tokens) keeps alive from forward to backward, per
        module of decoder layer `layer` and for the model's ends, on one of `tp` tensor-parallel ranks
        (sequence parallelism: norms and residuals hold seq/tp tokens, the projections hold every
        token but 1/tp of the features).

        Keys: "attention_norm", "attention", "ffn_norm", and "feed_forward" (a dense layer) or "moe"
        (a MoE layer); summed they are the layer; "head" (once per model: the final norm's input and
        output, and the input gradient [seq, H] that the training loss fused with the output
        projection makes in its forward: no logits are kept; its weight gradient [V/tp, H] is per
        micro-batch, not per sample, and not counted here). The terms are the tensors our plain-math implementation
        hands to backward (mf_models' attention without the fused kernel, which CPU lacks): each
        norm's input and its normalised output; the projections' shared input; q, k, v after RoPE,
        their pre-RoPE copies and rotate_half's output (the rotation's two products keep both
        operands); the GQA-repeated k, v; three [heads, seq, seq] tensors: the raw scores (kept by
        the scaling product), the scaled masked scores and the softmax probabilities; the attention
        output; SwiGLU's two projections, the SiLU and the product. `fused_attention` (Ascend's
        flash attention kernel, `use_flash_attention`) keeps the softmax statistics per head and
        token instead of the two [heads, seq, seq] tensors. MLA and MoE: see `_mla_terms` and
        `moe_activations`.
        """
        h = args.hidden_size
        shard = -(-seq // tp)                              # tokens of a sequence-parallel shard
        heads = args.num_attention_heads
        scores = (heads // tp) * seq * (2 if fused_attention else 3 * seq)
        norm = shard * h + seq * h                          # input shard, gathered normalised output
        if self.attention == "mla":
            attention = _mla_terms(args, seq, tp) + scores
        else:
            hd = args.head_dim
            kv_heads = args.num_key_value_heads or heads
            q, kv = heads * hd // tp, kv_heads * hd // tp
            repeat = 2 * seq * q if kv_heads != heads else 0   # repeat_kv materialises k and v at q's width
            qk_norm = seq * (q + kv) if self.has_qk_norm(args) else 0
            attention = seq * (3 * (q + kv) + kv) + repeat + qk_norm + scores + seq * q
        out = {"attention_norm": norm, "attention": attention, "ffn_norm": norm}
        if args.is_moe_layer(layer):
            # Qwen2-MoE's gate on the shared experts keeps their output [T, H] and its sigmoid [T, 1]
            gate = shard * (h + 1) + shard if self.shared_gate else 0
            out["moe"] = moe_activations(args, shard)["total"] + gate
        else:
            out["feed_forward"] = 4 * seq * (args.intermediate_size // tp)
        out["head"] = shard * h + seq * h + seq * h
        return out


def _mla_terms(args, seq: int, tp: int) -> int:
    """MLA's kept tensors without the scores, for `seq` gathered tokens on one of `tp` ranks: the
    query bottleneck (wq_a's output and q_norm's), q and its rope part (split copy, de-interleaved
    copy, rotate_half, rotated), the concatenated q; wkv_a's output, kv_norm's input and output, the
    shared k_rope's four stages; wkv_b's output, the concatenated k with k_rope broadcast to every
    head, v's split copy; the attention output (wo's input)."""
    heads = args.num_attention_heads // tp
    rope, qk, nope, v = args.qk_rope_head_dim, args.qk_head_dim, args.qk_nope_head_dim, args.v_head_dim
    copies = 4 if args.rope_interleave else 3
    latent = (2 * args.q_lora_rank if args.q_lora_rank is not None else 0) + \
        (args.kv_lora_rank + rope) + 2 * args.kv_lora_rank + copies * rope
    per_head = qk + copies * rope + qk + (nope + v) + qk + rope + v + v
    return seq * (latent + heads * per_head)


def moe_activations(args, tokens: int, expert_parallel: int = 1) -> dict[str, int]:
    """Elements a MoE layer keeps for backward on `tokens` tokens (a rank's sequence shard: under
    tensor parallelism each rank runs the whole MoE on its own tokens).

    N = tokens x top_k assignments go to blocks of b = rows_per_block(N, E) rows (dispatch.py), at
    most max_blocks(N, E, b) of them: R rows in all (padding included). Kept: the router's logits,
    scores and selection weights ([T, E] x 3 + [T, k]); the dispatched rows [R, H]; each block's
    gathered expert weights (w1, w3 [I, H], w2 [H, I] per block: the batched matmuls keep their
    weight operand, so this term grows with the blocks, not the experts); the SwiGLU
    intermediates [R, I] x 4; the experts' output rows [R, H] and the combine's gathered,
    weighted rows [N, H]; the shared experts' SwiGLU [T, I_shared] x 4. Returns every term and
    "total".

    `expert_parallel` P > 1 sizes mf-parallel's all-to-all dispatcher (its static buffer): the
    router acts on this rank's T tokens, but the local experts (E / P of them plus the null expert
    of empty slots, top-1) run on all P x N received slots; the combine keeps the reverse
    exchange's [P, N, H] rows and the [N, H] rows sent (both kept by their mask products) beside
    the weighted rows."""
    e, k, f, shared = args.moe_sizes()
    h = args.hidden_size
    n = tokens * k
    if expert_parallel > 1:
        slots, local = expert_parallel * n, e // expert_parallel + 1
        b = rows_per_block(slots, local)
        blocks = max_blocks(slots, local, b)
        combine = n * h + slots * h + n * h
    else:
        b = rows_per_block(n, e)
        blocks = max_blocks(n, e, b)
        combine = n * h
    rows = blocks * b
    terms = {"router": tokens * (3 * e + k), "rows": rows * h, "gathered_weights": blocks * 3 * f * h,
             "swiglu": 4 * rows * f, "expert_out": rows * h, "combine": combine, "shared_experts": 4 * tokens * shared,
             "blocks": blocks, "rows_per_block": b}
    terms["total"] = sum(v for key, v in terms.items() if key not in ("blocks", "rows_per_block"))
    return terms
