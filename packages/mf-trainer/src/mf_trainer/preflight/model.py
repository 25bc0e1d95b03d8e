"""The `model` section: known model type, known keys with valid values (the model's own argument
dataclass, e.g. `model.hidden_sizee` is a typo of hidden_size), and whether tensor parallelism
splits it (heads, vocabulary, intermediate size). Needs the argument classes only, not MindSpore.
"""

from __future__ import annotations

from mf_trainer.preflight.registry import COMMANDS, TRAINING, check, model_section, split_line


@check(commands=COMMANDS)
def model_arguments(t):
    """The model section names a registered model with valid arguments."""
    import mf_models

    model = t.cfg.model
    if model.model_type is None and model.architectures is None and t.cfg.run_mode == "finetune":
        # mf_trainer.sources fills it from the base when the base records one (unread with files=False)
        if not t.files:
            return
        import os

        base = t.cfg.checkpoint.load_path
        why = ("does not exist (yet): make the base first, or" if not os.path.exists(base) else
               "records no model (no config.json, no hf_config):")
        yield "model", f"omitted (a fine-tune takes its base's), and checkpoint.load_path {base} {why} give the model section"
        return
    try:
        mf_models.build_args(model_section(t.cfg))
    except mf_models.ModelConfigError as exc:
        yield split_line(str(exc), "model")


@check(commands=TRAINING)
def tensor_parallel_split(t):
    """tensor_parallel splits the model's heads and sharded dimensions."""
    from mf_models import tensor_parallel_problems

    args, tp = t.model_args, t.layout.tp if t.layout is not None else 1
    if args is None or tp <= 1:
        return
    world = t.dims.world_size if t.dims is not None else (t.world or tp)
    for line in tensor_parallel_problems(args, tp, world):
        yield split_line(line, "parallelism.tensor_parallel")


@check(commands=TRAINING)
def model_trains_as_configured(t):
    """What a model runs for inference but cannot train as configured (GPT-2's dropout)."""
    args = t.model_args
    if args is None:
        return
    for line in args.training_problems():
        yield split_line(line, "model")


@check(commands=TRAINING)
def multi_token_prediction_layout(t):
    """Multi-token prediction (num_nextn_predict_layers > 0): not beside context parallelism (the
    shifted tokens and labels would cross the zigzag chunks), nor with tied embeddings on a pipeline
    whose last stage lacks the embedding."""
    args = t.model_args
    depth = getattr(args, "num_nextn_predict_layers", 0) if args is not None else 0
    if not depth:
        return
    par = t.cfg.parallelism
    if par.context_parallel > 1:
        yield ("parallelism.context_parallel", f"{par.context_parallel} with model.num_nextn_predict_layers={depth} is "
               "not implemented (multi-token prediction shifts tokens and labels across the context-parallel chunks); "
               "set context_parallel: 1 or num_nextn_predict_layers: 0")
    if par.pipeline_parallel > 1 and args.tie_word_embeddings:
        yield ("parallelism.pipeline_parallel", f"{par.pipeline_parallel} with model.num_nextn_predict_layers={depth} "
               "and tie_word_embeddings: true is not implemented; set tie_word_embeddings: false (DeepSeek-V3's and "
               "GLM-4.5's) or num_nextn_predict_layers: 0")
