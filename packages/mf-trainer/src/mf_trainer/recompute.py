"""The `recompute` section -> MindSpore's `Cell.recompute()` on the chosen layers or modules.

`mode: full` recomputes whole decoder layers (`full_recompute_layer` specs); `mode: select` maps
module paths inside a layer (`attention`, `feed_forward`, `attention.wq`, ...) to layer specs.
`Cell.recompute()` works in GRAPH_MODE and PyNative (checked on CPU: the same losses with and
without it). A module path a layer does not have is an error listing the layer's modules.
"""

from __future__ import annotations

import mf_config
from mf_trainer.errors import TrainerConfigError


def _resolve(layer, path: str, key: str):
    cell = layer
    for part in path.split("."):
        children = dict(cell.name_cells())
        if part not in children:
            raise TrainerConfigError(f"{key}: the layer has no module {path!r}; its modules are: "
                                     f"{', '.join(children)}")
        cell = children[part]
    return cell


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
            marked.append(f"layers.{i}.{path}")
    return marked
