"""The `swap` section -> which Cells offload their saved activations (activation_offload.py).

    swap:
      enable: True
      default_prefetch: 1
      layer_swap: [{layers: ['0-1']}]                       # decoder layers 0 and 1, whole
      op_swap: [{op_name: attention, layers: ['2']},        # a module of a layer: mf's name or
                {op_name: mlp, layers: ['3']}]              # MindFormers' (mf_models.LAYER_MODULE_ALIASES)

`apply_swap(model, cfg.swap, device)` wraps `model.layers[i]` for each layer of `layer_swap` and
the named module of each layer of `op_swap` (`mlp`: the layer's `feed_forward` or, in a routed
layer, its `moe`), and returns the `ActivationOffload` whose `stats` count what each moved.
Applied by the Trainer with `recompute`, after tensor / context / expert parallelism and before
FSDP (mf_models' plan order): the hooks are local to the rank, so every layout offloads its own
share, and a pipeline stage the layers it holds.

PyNative only. MindSpore's GRAPH_MODE mechanism (`Cell.offload`) marks the primitives a Cell
holds as attributes, and its offload pass acts only inside `lazy_inline` Cells (on Ascend): mf's
models call functional operators and are not `lazy_inline`, so `Cell.offload` on a llama layer
marks 2 primitives (the attention core's two batch matmuls) of the layer's dozens and MindSpore's
CPU compile inserts no move at all. A run with swap and `context.mode: 0` therefore trains in
PyNative (`GRAPH_MODE_BLOCKER`, one warning), where every saved activation of the selected Cells
is offloaded.

On CPU the device is the host: the offload runs (copies out and back, counted) but frees no memory
and `default_prefetch` has no transfer to hide: the preflight's one notice line says so.
"""

from __future__ import annotations

import logging

import mf_config
import mf_models
from mf_trainer.activation_offload import ActivationOffload
from mf_trainer.callbacks import Callback
from mf_trainer.errors import TrainerConfigError

log = logging.getLogger("mf_trainer")

GRAPH_MODE_BLOCKER = ("swap offloads through saved-tensor hooks, which run in PyNative only (GRAPH_MODE's "
                      "Cell.offload reaches only primitives a Cell holds, inside lazy_inline Cells: none of "
                      "mf's models' operators)")


def swap_units(swap_cfg, n_layers: int) -> list[tuple[str, int, str | None]]:
    """[(the YAML entry, layer, module path or None for the whole layer)] in layer order; the
    module path as the YAML spells it (resolved on the built layer)."""
    units = []
    for i, entry in enumerate(swap_cfg.layer_swap or []):
        for layer in mf_config.parse_layer_spec(entry.layers, n_layers, f"swap.layer_swap[{i}].layers"):
            units.append((f"swap.layer_swap[{i}]", layer, None))
    for i, entry in enumerate(swap_cfg.op_swap or []):
        for layer in mf_config.parse_layer_spec(entry.layers, n_layers, f"swap.op_swap[{i}].layers"):
            units.append((f"swap.op_swap[{i}]", layer, entry.op_name))
    return sorted(units, key=lambda unit: unit[1])


def apply_swap(model, swap_cfg, device: str) -> ActivationOffload | None:
    """Wrap the selected layers and modules of `model` (whole model, before any pipeline split);
    None when swap is off. Logs what it wrapped."""
    if not swap_cfg.enable:
        return None
    offload = ActivationOffload(device, swap_cfg.default_prefetch)
    wrapped: list[str] = []
    layers = model.layers
    for where, i, path in swap_units(swap_cfg, len(layers)):
        cell = layers[i]
        if path is not None:
            try:
                cell = mf_models.resolve_layer_module(layers[i], path, f"{where}.op_name (layer {i})")
            except mf_models.ModelConfigError as exc:
                raise TrainerConfigError(str(exc)) from None
        name = f"layers.{i}" if path is None else f"layers.{i}.{_cell_path(layers[i], cell)}"
        if hasattr(type(cell), "offload_unit"):
            raise TrainerConfigError(f"{where}: {name} is offloaded twice (as {type(cell).offload_unit} already)")
        offload.wrap(cell, name)
        wrapped.append(name)
    log.info("swap: saved activations of %s go to host memory after their forward (prefetch %d ahead in backward)",
             ", ".join(wrapped), swap_cfg.default_prefetch)
    return offload


def _cell_path(layer, cell) -> str:
    for name, sub in layer.cells_and_names():
        if sub is cell:
            return name
    raise AssertionError("resolve_layer_module returned a cell outside the layer")


def describe(stats, before: dict | None = None) -> str:
    """`2 unit(s) moved 68 saved activations (0.61 MiB) to host and back: layers.0 56 (0.45 MiB), ...`
    for the stats since `before` (an earlier `stats.snapshot()`): the units that ran in between
    (a pipeline rank runs its own stage's)."""
    base = (before or {}).get("units", {})
    parts, total, count = [], 0, 0
    for name, unit in stats.units.items():
        if unit.calls == base.get(name, {}).get("calls", 0):
            continue
        packed = unit.packed - base.get(name, {}).get("packed", 0)
        nbytes = unit.bytes_out - base.get(name, {}).get("bytes_out", 0)
        parts.append(f"{name} {packed} ({nbytes / 2**20:.2f} MiB)")
        total, count = total + nbytes, count + packed
    return (f"{len(parts)} unit(s) moved {count} saved activations ({total / 2**20:.2f} MiB) to host and back: "
            + (", ".join(parts) or "none ran"))


class SwapReport(Callback):
    """Logs what the first step of this process offloaded (this rank's share), per unit."""

    def __init__(self, offload: ActivationOffload) -> None:
        self.offload = offload
        self.before: dict | None = None

    def on_train_begin(self, trainer) -> None:
        self.before = self.offload.stats.snapshot()

    def on_step_end(self, trainer, metrics: dict) -> None:
        if self.before is not None:
            log.info("swap: step %d: %s", metrics.get("step", 0), describe(self.offload.stats, self.before))
            self.before = None
