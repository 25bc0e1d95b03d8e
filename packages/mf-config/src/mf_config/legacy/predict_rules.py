"""A `run_mode: predict` config: the model, its weights, tokenizer and generation settings.

MindFormers' predict YAMLs are training YAMLs with `run_mode: predict` (the prompts came from the
command line: `run_mindformer.py --predict_data`). mf's predict YAML is the same schema with an
`inference` section, read by `mf generate CONFIG --prompt ...` and `mf serve CONFIG`, which run
one process and train nothing: the sections only training uses are reported as unneeded here
instead of being translated (a parallel layout or an optimizer would be refused by no one and
used by nothing).
"""

from __future__ import annotations

from mf_config.errors import fmt_value
from mf_config.legacy.session import Migration

# Top-level keys of the older format that only training reads.
TRAINING_ONLY = ("runner_config", "runner_wrapper", "parallel_config", "parallel", "use_parallel", "recompute_config",
                 "swap_config", "optimizer", "lr_schedule", "train_dataset", "train_dataset_task", "eval_dataset",
                 "eval_dataset_task", "do_eval", "eval_step_interval", "eval_epoch_interval",
                 "micro_batch_interleave_num", "layer_scale", "layer_decay", "lr_scale", "lr_scale_factor",
                 "callbacks", "eval_callbacks", "monitor_config", "tensorboard", "metric", "moe_config_mcore",
                 "resume_training", "train_precision_sync")
_WHY = "a training setting: `mf generate` / `mf serve` run one process and train nothing"


def is_predict(m: Migration) -> bool:
    return m.value(("run_mode",)) == "predict"


def predict_sections(m: Migration) -> None:
    """Before the run rules: the sections only training reads are unneeded."""
    for key in TRAINING_ONLY:
        if m.src.has((key,)) and not m.src.is_handled((key,)):
            m.unneeded((key,), _WHY)
    for key in ("offset", "pp_interleave_num", "layers_per_stage"):  # pipeline placement
        if m.src.has(("model", "model_config", key)):
            m.unneeded(("model", "model_config", key), _WHY)


def migrate_predict(m: Migration) -> None:
    """After the run rules: the weights and tokenizer are required, the prediction batch becomes
    the engine's slots."""
    batch = m.value(("model", "model_config", "batch_size"))
    if isinstance(batch, int) and not isinstance(batch, bool) and batch >= 1:
        m.copy(("model", "model_config", "batch_size"), "inference.batch_size", batch,
               note="prompts generated together (the engine's slots)")
    hf_dir = m.value(("pretrained_model_dir",))
    if not m.get_new("checkpoint.load_path") and isinstance(hf_dir, str) and hf_dir:
        m.set("checkpoint.load_path", hf_dir)
        m.line(("pretrained_model_dir",), "translated", f"checkpoint.load_path: {fmt_value(hf_dir)} (the Hugging Face "
               "directory holds the weights as well as the tokenizer)", mark=False)
    if not m.get_new("checkpoint.load_path"):
        m.set("checkpoint.load_path", "")
        m.action(("load_checkpoint",) if m.src.has(("load_checkpoint",)) else ("model",),
                 "checkpoint.load_path: the weights to generate with are not named: set it to a Hugging Face "
                 "directory or an mf checkpoint (`mf generate CONFIG --set checkpoint.load_path=DIR`)",
                 fix="checkpoint.load_path")
    if not m.get_new("tokenizer.path"):
        m.action(("processor",) if m.src.has(("processor",)) else ("model",),
                 "tokenizer.path: no tokenizer is named: set it (a Hugging Face directory or a sentencepiece .model) "
                 "to generate from text prompts, or give token ids with --prompt-ids", fix="tokenizer.path")
    m.set("inference.max_new_tokens", m.get_new("inference.max_new_tokens", 128))
    if m.get_new("checkpoint.load_path") == "":
        m.new["checkpoint"].pop("load_path")
    m.line(("run_mode",), "translated", f"run_mode: predict with an inference section (max_new_tokens "
           f"{fmt_value(m.get_new('inference.max_new_tokens'))}): run it with `mf generate CONFIG --prompt TEXT` or "
           "`mf serve CONFIG`", mark=False)
