"""The `recompute` section -> MindSpore's `Cell.recompute()` on the chosen layers or modules.

`mode: full` recomputes whole decoder layers (`full_recompute_layer` specs); `mode: select` maps
module paths inside a layer (`attention`, `feed_forward`, `attention.wq`, ...) to layer specs; the
reference's MindFormers names (`mlp`, `self_attention`, ...) select the same modules
(mf_models.layer_module_path).
`Cell.recompute()` works in GRAPH_MODE and PyNative (checked on CPU: the same losses with and
without it). A module path a layer does not have is an error listing the layer's modules.

`recompute_comm` is not a Cell mark: it changes the tensor-parallel plan (mf-models moves the
selected modules' sequence-parallel all-gathers into their projections, which gather again in
backward); `recompute_comm_selection` reads its section into the plan's {layer: modules}.
"""

from __future__ import annotations

import mf_config
import mf_models
from mf_trainer.errors import TrainerConfigError


def _resolve(layer, path: str, key: str):
    """The module `path` names in `layer` (mf's names or MindFormers'; `mlp` is a routed layer's
    `moe` too), or one line listing the layer's modules."""
    try:
        return mf_models.resolve_layer_module(layer, path, key)
    except mf_models.ModelConfigError as exc:
        raise TrainerConfigError(str(exc)) from None


def apply_recompute(model, recompute_cfg) -> list[str]:
    """Mark cells for recomputation; returns what was marked (for the log)."""
    mode = recompute_cfg.mode
    if mode == "None":
        return []
    layers = model.layers
    n = len(layers)
    marked = []
    if mode == "full":
        for i in mf_config.parse_layer_spec(recompute_cfg.full_recompute_layer, n, "recompute.full_recompute_layer"):
            layers[i].recompute()
            marked.append(f"layers.{i}")
        return marked
    for path, specs in recompute_cfg.select_module.items():
        key = f"recompute.select_module.{path}"
        for i in mf_config.parse_layer_spec(specs, n, key):
            _resolve(layers[i], path, key).recompute()
            resolved = mf_models.module_in_layer(path, tuple(layers[i].name_cells()))
            marked.append(f"layers.{i}.{resolved}")
    return marked


def recompute_comm_selection(recompute_comm_cfg, n_layers: int) -> dict[int, frozenset[str]] | None:
    """{layer: modules whose input all-gather is re-done in backward}, or None when off."""
    import mf_models

    if not recompute_comm_cfg.enable:
        return None
    chosen: dict[int, set[str]] = {}
    for key, specs in recompute_comm_cfg.select_module.items():
        where = f"recompute_comm.select_module['{key}']"
        try:
            module = mf_models.recompute_comm_module(key, where)
        except mf_models.ModelConfigError as exc:
            raise TrainerConfigError(str(exc)) from None
        for i in mf_config.parse_layer_spec(specs, n_layers, where):
            chosen.setdefault(i, set()).add(module)
    return {i: frozenset(m) for i, m in chosen.items()}
