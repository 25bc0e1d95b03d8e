"""GLM-4-0414's parameter and activation tables (`mf plan`): Llama's (`DecoderInventory`) with the
two norms each block adds after its attention and its MLP (no MindSpore)."""

from __future__ import annotations

from dataclasses import dataclass

from ..common.inventory import DecoderInventory, ParamEntry


@dataclass(frozen=True)
class Glm4Inventory(DecoderInventory):
    def parameters(self, args) -> list[ParamEntry]:
        out = []
        for e in super().parameters(args):
            out.append(e)
            # a layer's last parameter is its MLP's w3 (GLM-4 has no MLP biases): the post norms follow
            if e.name.endswith(".feed_forward.w3.weight"):
                layer = e.name.split(".feed_forward.")[0]
                out += [ParamEntry(layer + ".attention_post_norm.weight", (args.hidden_size,), None),
                        ParamEntry(layer + ".ffn_post_norm.weight", (args.hidden_size,), None)]
        return out

    def activations(self, args, seq: int, tp: int = 1, *, fused_attention: bool = False, layer: int = 0
                    ) -> dict[str, int]:
        """Llama's terms; each post norm runs on the sequence shard the row-parallel projection
        reduce-scatters to and keeps its input and output there, counted with the block's norm of
        the same sub-layer (attention_norm, ffn_norm)."""
        out = super().activations(args, seq, tp, fused_attention=fused_attention, layer=layer)
        post = 2 * -(-seq // tp) * args.hidden_size
        out["attention_norm"] += post
        out["ffn_norm"] += post
        return out
