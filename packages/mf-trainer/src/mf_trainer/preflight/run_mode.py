"""run_mode against the command, and what each mode needs: fine-tuning's base weights and LoRA,
the weights evaluation and generation read, the end-of-training sample's prompts and tokenizer.

`mf eval` takes an eval YAML or a training one; `mf generate` a predict YAML or a training one (the
weights of a training YAML are its run's last checkpoint: mf_trainer.sources); `mf serve` a
predict YAML."""

from __future__ import annotations

import os

from mf_trainer.preflight.parallel import changed
from mf_trainer.preflight.registry import EVAL, GENERATE, ONE_PROCESS, SERVE, Notice, check

_RUNS = {"eval": "mf eval", "predict": "mf generate"}
# inference fields that only shape the end-of-training sample (the others are carried in checkpoints)
_SAMPLE_ONLY = ("batch_size", "output_file")


@check(commands=(*ONE_PROCESS, "train", "launch"), gate=True)
def run_mode_fits_command(t):
    """run_mode is one this command runs."""
    mode = t.cfg.run_mode
    if t.command in ("train", "launch") and mode not in ("train", "finetune"):
        yield "run_mode", f"{mode!r} is not a training mode: run `{_RUNS[mode]} {t.config_name}`"
    elif t.command == EVAL and mode == "predict":
        yield "run_mode", "'predict' generates text: run it with `mf generate CONFIG`"
    elif t.command == GENERATE and mode == "eval":
        yield "run_mode", "'eval' evaluates: run it with `mf eval CONFIG` (mf generate takes a predict or training YAML)"
    elif t.command == SERVE and mode != "predict":
        yield "run_mode", (f"mf {t.command} needs a 'predict' config, got {mode!r} (set run_mode: predict, or give "
                           "the checkpoint directory itself)")


@check()
def finetune(t):
    """Fine-tuning starts from base weights; LoRA needs run_mode finetune."""
    cfg, ckpt = t.cfg, t.cfg.checkpoint
    if cfg.lora is not None and cfg.run_mode != "finetune":
        yield "lora", (f"LoRA adapts pretrained weights; it needs run_mode: finetune (with checkpoint.load_path), "
                       f"got run_mode {cfg.run_mode!r}")
    if cfg.run_mode != "finetune":
        return
    if not ckpt.load_path:
        yield "checkpoint.load_path", ("run_mode finetune starts from pretrained weights (an HF directory or an mf "
                                       "checkpoint); set it, or use run_mode train to start from scratch")
    elif os.path.realpath(ckpt.save_path) == os.path.realpath(ckpt.load_path):
        yield "checkpoint.save_path", (f"is checkpoint.load_path ({ckpt.load_path}); a fine-tune saves beside its "
                                       "base, never into it (rotation could delete the base)")


_OWN_WEIGHTS = ("empty, and checkpoint.save_path {where} holds no checkpoint yet (a training YAML is read with the "
                "weights its run produced): train first, or give --weights PATH")


@check(commands=(EVAL,))
def eval_weights(t):
    """Evaluation reads weights from checkpoint.load_path (a training YAML: its run's checkpoint)."""
    if t.cfg.run_mode == "eval" and t.cfg.lora is not None:
        yield "lora", ("run_mode eval evaluates the weights in checkpoint.load_path; a LoRA adapter checkpoint "
                       "carries its own settings (remove the lora section)")
    if not t.cfg.checkpoint.load_path:
        yield "checkpoint.load_path", (_OWN_WEIGHTS.format(where=t.cfg.checkpoint.save_path)
                                       if t.cfg.run_mode in ("train", "finetune") else
                                       "evaluation needs weights (an mf checkpoint, a LoRA adapter checkpoint or a "
                                       "Hugging Face directory)")


@check(commands=(GENERATE, SERVE))
def generation_weights(t):
    """Generation reads weights from checkpoint.load_path (a training YAML: its run's checkpoint)."""
    if t.cfg.checkpoint.load_path:
        return
    if t.cfg.run_mode == "predict":
        yield "checkpoint.load_path", "run_mode predict needs the weights to generate with"
    elif t.cfg.run_mode in ("train", "finetune"):
        yield "checkpoint.load_path", _OWN_WEIGHTS.format(where=t.cfg.checkpoint.save_path)


@check()
def end_of_training_sample(t):
    """The inference section: the sampling settings travel in every checkpoint (its
    generation_config: the defaults of `mf generate` / `mf serve`); the sample's own batch size and
    output file act with prompts; prompts need a sentencepiece tokenizer."""
    cfg, inf = t.cfg, t.cfg.inference
    if not (inf.prompts or inf.input_file):
        for name in _SAMPLE_ONLY:
            if changed(inf, name):
                yield Notice(f"inference.{name}", "set without inference.prompts or input_file: no sample is generated "
                                                  "here, so it has nothing to act on")
    elif not cfg.tokenizer.path:
        yield "tokenizer.path", "required to turn inference.prompts into tokens for the end-of-training sample"
    if cfg.tokenizer.path and cfg.tokenizer.type != "sentencepiece":
        yield "tokenizer.type", f"{cfg.tokenizer.type!r} tokenizers are not supported yet; use sentencepiece"
