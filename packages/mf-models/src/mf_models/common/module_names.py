"""The names of a decoder layer's modules as other stacks write them.

mf's decoder layers hold `attention_norm`, `attention` (wq, wk, wv, wo, or MLA's projections),
`ffn_norm` and `feed_forward` (w1, w2, w3) or, in a routed layer, `moe` (router, experts, shared
experts) - Meta's llama names. The YAML fields that name modules inside a layer
(`recompute.select_module`, `swap.op_swap[].op_name`) also take MindFormers' (Megatron-Core's) and
Hugging Face's names for them, so the reference's own examples (`"attention"`, `"mlp"`) select
what they say.

    layer_module_path("self_attention.wq")                 # 'attention.wq' (names only)
    layer_modules(args, 3)                                 # ('attention_norm', 'attention', 'ffn_norm', 'moe')
    module_in_layer("mlp", layer_modules(args, 3))         # 'moe': the layer's MLP, dense or routed
    resolve_layer_module(model.layers[3], "mlp", key)      # the Cell, or one ModelConfigError line

No MindSpore: the preflight resolves names from the model's arguments, the trainer on the built
layer.
"""

from __future__ import annotations

from ..errors import ModelConfigError

# first path component as MindFormers / Megatron-Core / transformers write it -> mf's module
LAYER_MODULE_ALIASES = {
    "mlp": "feed_forward",                      # MindFormers, Megatron-Core, transformers
    "self_attention": "attention",              # MindFormers, Megatron-Core
    "self_attn": "attention",                   # transformers
    "input_layernorm": "attention_norm",        # Megatron-Core, transformers
    "pre_mlp_layernorm": "ffn_norm",            # Megatron-Core
    "post_attention_layernorm": "ffn_norm",     # transformers (the norm before the MLP)
}


def layer_module_path(path: str) -> str:
    """`path` inside a decoder layer with its first component in mf's names: `mlp` ->
    `feed_forward`, `self_attention.wq` -> `attention.wq`; mf's own names unchanged."""
    first, dot, rest = path.partition(".")
    return LAYER_MODULE_ALIASES.get(first, first) + dot + rest


# ----------------------------------------------------------------------------- per layer
# A name can mean another module in another layer: MindFormers calls every layer's MLP
# `feed_forward` / `mlp`, dense or routed; mf calls a routed layer's `moe`. The functions below
# resolve a name in one layer (from the model's arguments, or on the built layer).

def layer_modules(args, layer: int) -> tuple[str, ...]:
    """The top-level modules of decoder layer `layer` of a model with arguments `args`."""
    return ("attention_norm", "attention", "ffn_norm", "moe" if args.is_moe_layer(layer) else "feed_forward")


def module_in_layer(path: str, modules) -> str | None:
    """mf's path for `path` (either spelling) in a layer whose top-level modules are `modules`:
    `mlp` / `feed_forward` are its MLP, dense or routed (`moe`); None when the first component
    names none of `modules` (mf's `moe` in a dense layer, say)."""
    first, dot, rest = layer_module_path(path).partition(".")
    if first == "feed_forward" and first not in modules and "moe" in modules:
        first = "moe"
    return first + dot + rest if first in modules else None


def module_names_help(modules) -> str:
    """`attention_norm, attention, ffn_norm, feed_forward (or MindFormers' names for them: mlp, ...)`."""
    return f"{', '.join(modules)} (or MindFormers' names for them: {', '.join(LAYER_MODULE_ALIASES)})"


def resolve_layer_module(layer, path: str, key: str):
    """The sub-cell of a built decoder layer that `path` names (either spelling). One line naming
    `key` and listing the layer's modules when it names none."""
    modules = tuple(layer.name_cells())
    resolved = module_in_layer(path, modules)
    if resolved is None:
        raise ModelConfigError(f"{key}: the layer has no module {path!r}; its modules are: {module_names_help(modules)}")
    cell = layer
    for part in resolved.split("."):
        children = dict(cell.name_cells())
        if part not in children:
            raise ModelConfigError(f"{key}: {path!r} is not a module of the layer; {type(cell).__name__} holds: "
                                   f"{', '.join(children) or 'no modules'}")
        cell = children[part]
    return cell
