"""The optimizer: its type and pass-through keys, and the layouts Muon can honour."""

from __future__ import annotations

from mf_trainer.preflight.registry import check


@check()
def optimizer_keys(t):
    """optimizer.type is AdamW or Muon and its pass-through keys are the ones it takes."""
    from mf_trainer.errors import TrainerConfigError
    from mf_trainer.optimizer_options import optimizer_options
    from mf_trainer.preflight.registry import split_line

    try:
        optimizer_options(t.cfg.optimizer)
    except TrainerConfigError as exc:
        yield split_line(str(exc), "optimizer")


@check()
def muon_layout(t):
    """Muon orthogonalises whole matrices: FSDP/HSDP shards are gathered, tensor-parallel slices are not."""
    if t.cfg.optimizer.type == "Muon" and t.cfg.parallelism.tensor_parallel > 1:
        yield "optimizer.type", (f"Muon with parallelism.tensor_parallel {t.cfg.parallelism.tensor_parallel} is not "
                                 "implemented (Newton-Schulz needs each matrix whole; only FSDP/HSDP shards are "
                                 "gathered); use tensor_parallel: 1 or type: AdamW")
