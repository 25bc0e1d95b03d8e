"""The optimizer: its type and pass-through keys, and the layouts Muon can honour."""

from __future__ import annotations

from mf_trainer.preflight.registry import Notice, check


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


@check()
def weight_decay_patterns(t):
    """weight_decay_include / weight_decay_exclude patterns name parameters of the model."""
    import mf_models
    from mf_trainer.errors import TrainerConfigError
    from mf_trainer.preflight.registry import split_line
    from mf_trainer.weight_decay import unmatched_patterns

    opt, args = t.cfg.optimizer, t.model_args
    if args is None or not (opt.weight_decay_include or opt.weight_decay_exclude):
        return
    try:
        names = [entry.name for entry in mf_models.parameter_inventory(args)]
    except mf_models.ModelConfigError:
        return        # a model the inventory does not cover: the optimizer applies the patterns as they are
    try:
        unmatched = unmatched_patterns(names, opt.weight_decay_include, opt.weight_decay_exclude)
    except TrainerConfigError as exc:
        yield split_line(str(exc), "optimizer")
        return
    sample = ", ".join(names[:4])
    for key, missing in unmatched.items():
        given = getattr(opt, key)
        if len(missing) == len(given):
            yield (f"optimizer.{key}", f"no pattern of {given} matches a parameter of this model (names look like: "
                                       f"{sample}, ...): check them for a typo")
        else:
            for pattern in missing:
                yield Notice(f"optimizer.{key}", f"pattern {pattern!r} matches no parameter of this model (it has "
                                                 "nothing to act on); the other patterns apply")
