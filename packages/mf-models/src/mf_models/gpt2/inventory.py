"""GPT-2's parameter and activation tables (`mf plan`), from its arguments alone (no MindSpore).

Not a `DecoderInventory`: LayerNorms with biases, a learned position table, multi-head attention
without rotary embedding, a GELU MLP with biases. The names, shapes, order and tensor-parallel axes
are the ones `GPT2LMHeadModel` and its plan (`parallelize.py`) make; tests/test_inventory.py builds
the model and compares.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..common.inventory import ParamEntry

# Tensors of [tokens, intermediate] the activation keeps for backward (its input included), as
# common/layers.py computes it: tanh form x, x^2, x^3, 0.5x, tanh, 1 + tanh, the output; erf form
# x, x / sqrt(2), 0.5x, 1 + erf, the output; relu its output.
KEPT_BY_ACTIVATION = {"gelu_new": 7, "gelu_pytorch_tanh": 7, "gelu_fast": 7, "gelu": 5, "relu": 2}


def _linear(prefix: str, d_in: int, d_out: int, style: str) -> list[ParamEntry]:
    # W [out, in]; Colwise splits rows and the bias, Rowwise the columns (bias replicated).
    return [ParamEntry(prefix + ".weight", (d_out, d_in), 0 if style == "col" else 1),
            ParamEntry(prefix + ".bias", (d_out,), 0 if style == "col" else None)]


def _layer_norm(prefix: str, h: int) -> list[ParamEntry]:
    return [ParamEntry(prefix + ".weight", (h,), None), ParamEntry(prefix + ".bias", (h,), None)]


@dataclass(frozen=True)
class Gpt2Inventory:
    def parameters(self, args) -> list[ParamEntry]:
        """The parameters `build_model` makes for `args`, in its order."""
        h, f = args.hidden_size, args.intermediate_size
        out = [ParamEntry("tok_embeddings.weight", (args.vocab_size, h), 0)]
        for i in range(args.num_hidden_layers):
            p = f"layers.{i}"
            out += _layer_norm(p + ".attention_norm", h)
            for w in ("wq", "wk", "wv"):
                out += _linear(f"{p}.attention.{w}", h, h, "col")
            out += _linear(p + ".attention.wo", h, h, "row")
            out += _layer_norm(p + ".ffn_norm", h)
            out += _linear(p + ".feed_forward.w1", h, f, "col") + _linear(p + ".feed_forward.w2", f, h, "row")
        out += _layer_norm("norm", h)
        if not args.tie_word_embeddings:
            out.append(ParamEntry("output.weight", (args.vocab_size, h), 0))
        # split by rows like the vocabulary (parallelize.py)
        out.append(ParamEntry("pos_embeddings.weight", (args.max_position_embeddings, h), 0))
        return out

    def activations(self, args, seq: int, tp: int = 1, *, fused_attention: bool = False, layer: int = 0
                    ) -> dict[str, int]:
        """`DecoderInventory.activations`' terms for GPT-2's block: the norms' input shard and
        gathered output; q, k, v (no rotary copies, no GQA repeat), the [heads, seq, seq] scores
        (or the fused kernel's statistics), the attention output; the MLP's w1 output and what its
        activation keeps (`KEPT_BY_ACTIVATION`)."""
        h = args.hidden_size
        shard = -(-seq // tp)
        heads = args.num_attention_heads
        q = h // tp
        scores = (heads // tp) * seq * (2 if fused_attention else 3 * seq)
        norm = shard * h + seq * h
        return {"attention_norm": norm, "attention": seq * 3 * q + scores + seq * q, "ffn_norm": norm,
                "feed_forward": KEPT_BY_ACTIVATION[args.activation_function] * seq * (args.intermediate_size // tp),
                "head": shard * h + seq * h + 2 * seq * (args.vocab_size // tp)}
