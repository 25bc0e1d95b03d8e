"""The optimizer `optimizer.type` names: AdamW (adamw.py) or Muon (muon.py, AdamW beside it for
the parameters Muon does not take)."""

from __future__ import annotations

from mf_trainer.adamw import AdamW, build_adamw
from mf_trainer.muon import build_muon
from mf_trainer.optimizer_options import optimizer_options


def build_optimizer(model, cfg, parallel=None):
    """The optimizer `optimizer.type` names, over `model`'s trainable parameters: AdamW, or Muon
    (`mf_trainer.muon`). `parallel`: the Trainer's ParallelContext (layouts and mesh: Muon
    gathers FSDP-sharded matrices); None for one process."""
    options = optimizer_options(cfg)
    named = [(p.name, p) for p in model.trainable_params()]
    if options is None:
        return build_adamw(named, cfg)
    layouts, mesh = None, None
    if parallel is not None:
        by_name = parallel.layouts(model)
        layouts = {id(p): by_name[name] for name, p in model.parameters_and_names()}
        mesh = parallel.mesh
    return build_muon(named, cfg, options, layouts, mesh)


__all__ = ["AdamW", "build_adamw", "build_optimizer"]
