"""recompute_comm: the sequence-parallel all-gathers a decoder block re-does in backward.

Under tensor parallelism with sequence parallelism, a block all-gathers its norm's sequence shard
twice: before the attention's q/k/v projections and before the MLP's w1/w3. The plain plan
gathers once per module (`PrepareModuleInput`) and the projections keep the full-sequence input
for their weight gradients: s x h per gather, per micro-batch, until backward. For a selected
(layer, module) the plan drops that module-level gather and lets each projection gather the shard
itself (`ColwiseParallel(input_layout="shard_seq", regather_input=True)`): its backward gathers
the shard again instead of keeping the full input. The cost, stated in the README: each
projection issues its own all-gather and reduce-scatter (q, k, v: three instead of one) and one
more all-gather in backward; the projection's matmul is re-run by the recomputing backward.

Which names select what (the seed's `attention.qkv`, MindFormers' `.*\\.norm` migrated to
`attention_norm` / `ffn_norm`, and the module names `recompute.select_module` uses) is
RECOMPUTE_COMM_MODULES.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import ModelConfigError

# select_module key -> the module whose input all-gather is re-done
RECOMPUTE_COMM_MODULES = {"attention": "attention", "attention.qkv": "attention", "attention_norm": "attention",
                          "feed_forward": "feed_forward", "ffn_norm": "feed_forward"}


def recompute_comm_module(key: str, where: str) -> str:
    """The module a select_module key names (one line naming the key otherwise)."""
    try:
        return RECOMPUTE_COMM_MODULES[key]
    except KeyError:
        raise ModelConfigError(f"{where}: {key!r} names no sequence-parallel all-gather; choose from "
                               f"{', '.join(RECOMPUTE_COMM_MODULES)}") from None


def _reads_only_projections(module) -> bool:
    """Modules whose construct uses its input only through the column-parallel projections (and
    reads the sequence length from their outputs): fed the shard, they compute the same thing.
    Llama's attention (and its subclasses that override only norm_qk) and the SwiGLU MLP."""
    from ..common.layers import FeedForward
    from ..llama.model import Attention

    if isinstance(module, FeedForward):
        return True
    return isinstance(module, Attention) and type(module).construct is Attention.construct


def apply_recompute_comm(plan: dict, model, selection: Mapping[int, frozenset[str]]) -> dict:
    """`plan` (the tp plan, {path: style}) with the selected modules' gathers moved into their
    projections. `selection`: layer index -> modules ("attention", "feed_forward")."""
    import mf_parallel as mp

    out = dict(plan)
    for i, modules in sorted(selection.items()):
        for module_name in sorted(modules):
            prefix = f"layers.{i}.{module_name}"
            where = f"recompute_comm.select_module: layer {i} {module_name}"
            module = getattr(model.layers[i], module_name, None)
            if not isinstance(out.get(prefix), mp.PrepareModuleInput) or module is None:
                raise ModelConfigError(f"{where}: this layer has no sequence-parallel all-gather there "
                                       f"(an MoE layer's tokens are dispatched, not gathered); leave it out")
            if not _reads_only_projections(module):
                raise ModelConfigError(f"{where}: not implemented for {type(module).__name__} (its construct reads the "
                                       "gathered input itself, not only through its projections); leave it out")
            del out[prefix]
            for path, style in plan.items():
                if (path.startswith(prefix + ".") and "." not in path[len(prefix) + 1:]
                        and isinstance(style, mp.ColwiseParallel) and style.input_layout == "gathered"):
                    out[path] = mp.ColwiseParallel(input_layout="shard_seq", output_layout=style.output_layout,
                                                   seq_axis=style.seq_axis, regather_input=True)
    return out
