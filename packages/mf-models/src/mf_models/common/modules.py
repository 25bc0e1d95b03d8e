"""What a decoder layer's parts are called: mf's names, and the names MindFormers' YAML uses.

Every mf decoder layer (llama, qwen2, qwen3, mixtral, qwen3_moe, deepseek_v3) has four top-level
modules: `attention_norm`, `attention`, `ffn_norm`, and `feed_forward` (a dense MLP) or `moe` (a
routed MoE layer). MindFormers' configuration reference selects the same parts by its own module
names (the seed's `op_swap: [{op_name: mlp}]`, `recompute.select_module: {mlp: ...}`); its
Megatron-style models call them `input_layernorm`, `self_attention`, `pre_mlp_layernorm`, `mlp`.
Both spellings select the same module here:

    layer_module_path("mlp", ("attention_norm", "attention", "ffn_norm", "moe"))    # -> "moe"
    layer_module_path("mlp.w1", layer_modules(args, 0))                           # -> "feed_forward.w1"
    layer_module_path("self_attention", ...)                                       # -> "attention"

`mlp` (and `feed_forward`, MindFormers' older name for it) means the layer's MLP whichever kind it
is: `feed_forward` in a dense layer, `moe` in a routed one, as MindFormers names both. mf's own
`moe` names only a routed layer's. Only the first component of a dotted path is translated (the
inside of a module keeps mf's names: `attention.wq`, `feed_forward.w1`).

No MindSpore: the preflight checks names from the model's arguments (`layer_modules(args, i)`),
and the trainer resolves them on the built layer (`resolve_layer_module`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ModelConfigError

# MindFormers' (Megatron-style) module name -> mf's. "mlp" is resolved per layer (dense or MoE).
MODULE_ALIASES = {"input_layernorm": "attention_norm", "self_attention": "attention",
                  "pre_mlp_layernorm": "ffn_norm", "mlp": "feed_forward"}
_MLP_NAMES = ("mlp", "feed_forward")


def layer_modules(args, layer: int) -> tuple[str, ...]:
    """The top-level modules of decoder layer `layer` of a model with arguments `args`."""
    mlp = "moe" if args.is_moe_layer(layer) else "feed_forward"
    return ("attention_norm", "attention", "ffn_norm", mlp)


def layer_module_path(path: str, modules: Sequence[str]) -> str | None:
    """mf's path for `path` (mf's or MindFormers' spelling of its first component) in a layer whose
    top-level modules are `modules`; None when the first component names none of them."""
    head, dot, rest = path.partition(".")
    if head in _MLP_NAMES:
        name = next((m for m in modules if m in ("feed_forward", "moe")), None)
    else:
        name = MODULE_ALIASES.get(head, head)
        name = name if name in modules else None
    return None if name is None else name + dot + rest


def module_names_help(modules: Sequence[str]) -> str:
    """`attention_norm, attention, ffn_norm, feed_forward (also: mlp, ...)` for error lines."""
    return f"{', '.join(modules)} (MindFormers' names too: {', '.join(MODULE_ALIASES)})"


def resolve_layer_module(layer, path: str, key: str):
    """The sub-cell of a built decoder layer that `path` names (either spelling). One line naming
    `key` and listing the layer's modules when it names none."""
    modules = tuple(layer.name_cells())
    resolved = layer_module_path(path, modules)
    if resolved is None:
        raise ModelConfigError(f"{key}: the layer has no module {path!r}; its modules are: "
                               f"{module_names_help(modules)}")
    cell = layer
    for part in resolved.split("."):
        children = dict(cell.name_cells())
        if part not in children:
            raise ModelConfigError(f"{key}: {path!r} is not a module of the layer; {type(cell).__name__} holds: "
                                   f"{', '.join(children) or 'no modules'}")
        cell = children[part]
    return cell
