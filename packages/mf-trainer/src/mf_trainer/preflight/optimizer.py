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
    # Pipeline stages step through their own runner and CP shards over dp x cp: neither has been
    # proven against one process with Muon yet, so neither is accepted.
    for key in ("pipeline_parallel", "context_parallel"):
        degree = getattr(t.cfg.parallelism, key)
        if t.cfg.optimizer.type == "Muon" and degree > 1:
            yield "optimizer.type", (f"Muon with parallelism.{key} {degree} is not implemented (Muon's parity with "
                                     "one process is proven for FSDP/HSDP only); use type: AdamW")
