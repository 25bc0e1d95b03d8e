"""Everything about the run itself: top-level keys, `context`, `runner_config` / `runner_wrapper`
leftovers, loading and saving checkpoints (`load_checkpoint`, `resume_training`, the
`CheckpointMonitor` callback), the other callbacks, monitoring, profiling, the tokenizer
(`processor`), `trainer` and `metric`.
"""

from __future__ import annotations

import os
from typing import Any

from mf_config.errors import fmt_value
from mf_config.legacy.session import Migration
from mf_config.legacy.tables import (
    CALLBACK_DEFAULT,
    CALLBACKS,
    CONTEXT,
    CONTEXT_DEFAULT,
    PROFILE,
    RUNNER_CONFIG,
    RUNNER_WRAPPER,
    TOP_LEVEL,
    TRAINER_TYPES,
    gone,
    lookup,
    moot,
)

_MODES = {"GRAPH_MODE": 0, "PYNATIVE_MODE": 1}
_CHECKPOINT_MONITORS = ("CheckpointMonitor", "CheckpointMointor")  # MindFormers registers both spellings
_CHECKPOINT_KEYS = {"prefix": "prefix", "directory": "save_path", "save_checkpoint_steps": "save_interleaved_steps",
                    "keep_checkpoint_max": "save_max", "async_save": "async_save",
                    "remove_redundancy": "remove_redundancy"}
_CHECKPOINT_DROPS = {
    "integrated_save": moot("each rank writes its own shards; `mf-ckpt` merges or converts them offline"),
    "save_network_params": moot("mf's checkpoints keep model and optimizer state in separate files: the model files "
                                "are the network weights"),
    "save_trainable_params": moot("LoRA runs save adapter-only checkpoints"),
    "checkpoint_format": gone("mf writes safetensors only", "safetensors"),
    "save_checkpoint_seconds": gone("mf saves by step count only", 0, None),
    "keep_checkpoint_per_n_minutes": gone("mf saves by step count only", 0, None),
    "append_info": moot("step and consumed samples are always stored (common.json)"),
}
_LOSS_MONITOR_BOOKKEEPING = ("learning_rate", "micro_batch_num", "micro_batch_interleave_num", "origin_epochs",
                             "dataset_size", "initial_epoch", "initial_step", "global_batch_size",
                             "gradient_accumulation_steps")
_PROFILE_KEYS = {"profile_start_step": "start_step", "profile_stop_step": "end_step",
                 "profile_memory": "profile_memory", "profile_rank_ids": "profiler_rank",
                 "profile_output": "output_path", "profile_level": "profiler_level", "with_stack": "with_stack",
                 "mstx": "mstx", "profile_cpu": "profile_cpu"}


def migrate_run(m: Migration) -> None:
    predict = m.value(("run_mode",)) == "predict"
    _top_level(m)
    _context(m)
    _runner(m)
    _checkpoint(m, predict)
    if not predict:  # a predict config's callbacks and monitors were reported as training-only
        _callbacks(m)
        _monitor(m)
    _profiler(m)
    _tokenizer(m, predict)
    _trainer_and_metric(m)
    m.drop_table((), TOP_LEVEL)


def _top_level(m: Migration) -> None:
    if m.src.has(("seed",)):
        m.copy(("seed",), "training.seed")
    for key in ("run_mode", "output_dir"):
        if m.src.has((key,)):
            m.copy((key,), key)
    sync = ("train_precision_sync",)
    if m.src.has(sync):
        if m.value(sync) is True:
            m.copy(sync, "training.deterministic", True)
        else:
            m.unneeded(sync, "off")


def _context(m: Migration) -> None:
    ctx = m.src.mapping(("context",))
    if "mode" in ctx:
        mode = ctx["mode"]
        m.copy(("context", "mode"), "context.mode", lookup(_MODES, mode, mode))
    for key in ("device_target", "device_id"):
        if key in ctx:
            m.copy(("context", key), f"context.{key}")
    if "deterministic" in ctx:
        if ctx["deterministic"] in ("ON", True):
            m.copy(("context", "deterministic"), "training.deterministic", True)
        else:
            m.unneeded(("context", "deterministic"), "off")
    m.drop_table(("context",), CONTEXT, CONTEXT_DEFAULT)


def _runner(m: Migration) -> None:
    m.drop_table(("runner_config",), RUNNER_CONFIG)
    wrapper = ("runner_wrapper",)
    scale = m.value((*wrapper, "scale_sense"))
    if m.src.has((*wrapper, "scale_sense")):
        if isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale == 1:
            m.unneeded((*wrapper, "scale_sense"), "a fixed loss scale of 1 is no scaling")
        else:
            m.dropped((*wrapper, "scale_sense"), "mf does not scale the loss (no fp16 training); a step whose "
                                                 "gradients are not finite is skipped instead "
                                                 "(training.max_consecutive_nonfinite)")
    clip, norm = m.value((*wrapper, "use_clip_grad")), m.value((*wrapper, "max_grad_norm"))
    if clip is True:
        value = float(norm) if isinstance(norm, (int, float)) and not isinstance(norm, bool) else 1.0
        m.copy((*wrapper, "use_clip_grad"), "training.max_norm", value,
               note="gradient clipping" + ("" if norm is not None else " at MindFormers' default max_grad_norm 1.0"))
        if m.src.has((*wrapper, "max_grad_norm")):
            m.translated((*wrapper, "max_grad_norm"), f"training.max_norm: {value}")
    elif clip is False:
        m.dropped((*wrapper, "use_clip_grad"), "mf always clips gradients (training.max_norm has no off value): "
                                               "raise training.max_norm to make clipping rare")
        if m.src.has((*wrapper, "max_grad_norm")):
            m.unneeded((*wrapper, "max_grad_norm"), "clipping was off")
    elif m.src.has((*wrapper, "max_grad_norm")):
        m.unneeded((*wrapper, "max_grad_norm"), "used only with use_clip_grad")
    m.drop_table(wrapper, RUNNER_WRAPPER)


def _checkpoint(m: Migration, predict: bool = False) -> None:
    load = m.value(("load_checkpoint",))
    name_path = ("model", "model_config", "checkpoint_name_or_path")
    named = m.value(name_path)
    resume = None if predict else m.value(("resume_training",))
    fmt = m.value(("load_ckpt_format",))
    if load in ("", None) and isinstance(named, str) and named:
        if "/" in named or "\\" in named or os.path.splitext(named)[1] in (".ckpt", ".safetensors"):
            load = named
            m.copy(name_path, "checkpoint.load_path", named)
        else:
            m.dropped(name_path, "a MindFormers model-zoo name: mf downloads nothing, set checkpoint.load_path")
    elif m.src.has(name_path):
        m.unneeded(name_path, "load_checkpoint is given and takes precedence" if named else "no weights named")
    if m.src.has(("load_checkpoint",)):
        if m.value(("load_checkpoint",)) in ("", None):
            m.unneeded(("load_checkpoint",), "empty: " + ("model_config.checkpoint_name_or_path names the weights"
                                                          if load not in ("", None) else "no checkpoint loaded"))
        elif os.path.splitext(str(load))[1] in (".ckpt", ".safetensors") or fmt == "ckpt":
            m.set("checkpoint.load_path", load)
            m.action(("load_checkpoint",), f"checkpoint.load_path: {fmt_value(load)}, but mf loads an mf checkpoint "
                     "directory or a Hugging Face directory, not a MindSpore checkpoint file: convert it first",
                     fix="checkpoint.load_path")
        else:
            m.copy(("load_checkpoint",), "checkpoint.load_path")
    loading = load not in ("", None)
    if m.src.has(("load_ckpt_format",)):
        m.line(("load_ckpt_format",), "unneeded" if fmt == "safetensors" or not loading else "dropped",
               "mf reads safetensors (mf checkpoints, Hugging Face directories)" if loading else "no checkpoint loaded")
    if resume not in (None, False) and loading:
        note = "" if resume is True else f"; mf resumes from the newest committed checkpoint, not {fmt_value(resume)}"
        m.copy(("resume_training",), "checkpoint.no_load_optim", False,
               note="optimizer state and step are restored from checkpoint.load_path" + note)
    elif resume not in (None, False):
        m.action(("resume_training",), "set checkpoint.load_path to the checkpoint directory to resume from",
                 fix="checkpoint.load_path")
    elif loading and not predict:
        m.set("checkpoint.no_load_optim", True)
        line = "checkpoint.no_load_optim: True (weights only, as MindFormers loads without resume_training)"
        if m.src.has(("resume_training",)):
            m.translated(("resume_training",), line)
        else:
            m.line(("load_checkpoint",), "translated", line, mark=False)
    elif m.src.has(("resume_training",)) and not m.src.is_handled(("resume_training",)):
        m.unneeded(("resume_training",), "off")
    if m.value(("run_mode",)) == "finetune" and not loading:
        m.action(("load_checkpoint",) if m.src.has(("load_checkpoint",)) else ("run_mode",),
                 "checkpoint.load_path: run_mode finetune starts from pretrained weights, and the old file names "
                 "none (load_checkpoint is empty): set it to a Hugging Face directory or an mf checkpoint",
                 fix="checkpoint.load_path")


def _callbacks(m: Migration) -> None:
    items = m.value(("callbacks",))
    if not isinstance(items, list):
        return  # no list: MindFormers' default callbacks, which is what mf does
    saves = False
    for i, item in enumerate(items):
        base = ("callbacks", i)
        kind = item.get("type") if isinstance(item, dict) else None
        if kind in _CHECKPOINT_MONITORS:
            saves = True
            _checkpoint_monitor(m, base, item)
        elif kind == "MFLossMonitor":
            _loss_monitor(m, base, item)
        else:
            m.drop(base, lookup(CALLBACKS, kind, CALLBACK_DEFAULT), prefix=f"{kind}: ")
    if not saves:
        m.set("checkpoint.enable_save", False)
        m.line(("callbacks",), "translated", "no CheckpointMonitor: checkpoint.enable_save: False (the old run saved "
               "no checkpoints)", mark=not items)


def _checkpoint_monitor(m: Migration, base: tuple, item: dict) -> None:
    m.translated((*base, "type"), "checkpoint.enable_save: True")
    m.set("checkpoint.enable_save", True)
    for key, new in _CHECKPOINT_KEYS.items():
        if key in item:
            m.copy((*base, key), f"checkpoint.{new}")
    m.drop_table(base, _CHECKPOINT_DROPS, gone("a CheckpointMonitor setting mf does not have"))


def _loss_monitor(m: Migration, base: tuple, item: dict) -> None:
    m.unneeded((*base, "type"), "mf always logs loss, learning rate and throughput")
    if "per_print_times" in item:
        m.copy((*base, "per_print_times"), "monitor.log_interval")
    if "check_for_nan_in_loss_and_grad" in item:
        path = (*base, "check_for_nan_in_loss_and_grad")
        if item["check_for_nan_in_loss_and_grad"] is True:
            m.copy(path, "training.max_consecutive_nonfinite", 1, note="training stops at the first non-finite step")
        else:
            m.unneeded(path, "off")
    m.drop_table(base, {k: moot("bookkeeping of MindFormers' loss monitor") for k in _LOSS_MONITOR_BOOKKEEPING},
                 gone("an MFLossMonitor setting mf does not have"))


def _monitor(m: Migration) -> None:
    mon = m.src.mapping(("monitor_config",))
    if mon:
        on = mon.get("monitor_on") is True
        targets = {"local_loss_format": "local_loss", "device_local_loss_format": "device_loss",
                   "device_local_norm_format": "device_norm"}
        for key in mon:
            path = ("monitor_config", key)
            if not on:
                m.unneeded(path, "monitor_on is off")
            elif key in targets and mon[key] is not None:
                m.copy(path, f"monitor.train_state.{targets[key]}", True)
            elif key == "monitor_on" or mon[key] is None:
                m.unneeded(path, "the monitor section has no master switch" if key == "monitor_on" else "off")
            else:
                m.dropped(path, "a MindFormers monitor with no equivalent in mf's monitor section")
    tb = m.src.mapping(("tensorboard",))
    if tb:
        if "tensorboard_dir" in tb:
            m.copy(("tensorboard", "tensorboard_dir"), "monitor.tensorboard", True,
                   note="mf writes the events under output_dir")
        m.drop_table(("tensorboard",), {
            "tensorboard_queue_size": moot("mf flushes its own event writer"),
            "log_loss_scale_to_tensorboard": moot("mf does not scale the loss"),
            "log_timers_to_tensorboard": gone("step timers are logged to metrics.jsonl, not TensorBoard", False),
        }, gone("a TensorBoard setting mf does not have"))


def _profiler(m: Migration) -> None:
    on = m.value(("profile",))
    keys = [k for k in ("profile", *_PROFILE_KEYS) if m.src.has((k,))]
    if not keys:
        m.drop_table((), PROFILE)
        return
    if on is not True:
        for key in keys:
            m.unneeded((key,), "profile is off")
        for key in PROFILE:
            if m.src.has((key,)):
                m.unneeded((key,), "profile is off")
        return
    m.copy(("profile",), "profiler.enable_profiling", True)
    for key, new in _PROFILE_KEYS.items():
        if m.src.has((key,)):
            m.copy((key,), f"profiler.{new}")
    m.drop_table((), PROFILE)


_HF_FOR_TRAINING = ("a Hugging Face tokenizer ({path}) is not written to a training config: training reads "
                    "pre-tokenised data (give the directory to `mf data preprocess-sft --tokenizer`), and the "
                    "end-of-training sample takes sentencepiece tokenizers only")


def _tokenizer(m: Migration, predict: bool = False) -> None:
    base = ("processor", "tokenizer")
    tok = m.src.mapping(base)
    vocab = tok.get("vocab_file") or tok.get("tokenizer_file")
    if isinstance(vocab, str) and vocab:
        key = "vocab_file" if tok.get("vocab_file") else "tokenizer_file"
        if vocab.endswith(".model"):
            m.copy((*base, key), "tokenizer.path", vocab)
            m.set("tokenizer.type", "sentencepiece")
        elif not predict:
            m.unneeded((*base, key), _HF_FOR_TRAINING.format(path=os.path.dirname(vocab) or "."))
        else:
            directory = os.path.dirname(vocab) or "."
            m.copy((*base, key), "tokenizer.path", directory, note="a Hugging Face tokenizer directory (the one "
                                                                  "holding the vocabulary files)")
            m.set("tokenizer.type", "hf")
    elif m.value(("pretrained_model_dir",)) and not predict:
        m.unneeded(("pretrained_model_dir",), _HF_FOR_TRAINING.format(path=m.value(("pretrained_model_dir",))))
    elif m.value(("pretrained_model_dir",)):
        m.copy(("pretrained_model_dir",), "tokenizer.path", note="tokenizer.type hf; to start from its weights, set "
                                                                 "checkpoint.load_path to it as well")
        m.set("tokenizer.type", "hf")
    if m.src.has(("pretrained_model_dir",)) and not m.src.is_handled(("pretrained_model_dir",)):
        m.unneeded(("pretrained_model_dir",), "the tokenizer comes from processor.tokenizer; the model from the model "
                                              "section")
    for key in tok:
        if not m.src.is_handled((*base, key)):
            m.unneeded((*base, key), "special tokens and the tokenizer class come from the tokenizer files")
    for key in m.src.mapping(("processor",)):
        if key != "tokenizer":
            m.line(("processor", key), "dropped" if key == "image_processor" else "unneeded",
                   "mf's models take text only" if key == "image_processor" else "mf has no processor objects")


def _trainer_and_metric(m: Migration) -> None:
    for key, value in m.src.mapping(("trainer",)).items():
        path = ("trainer", key)
        if key == "type" and value not in TRAINER_TYPES:
            m.dropped(path, f"mf trains causal language models only: {fmt_value(value)} has no equivalent")
        else:
            m.unneeded(path, "mf trains causal language models; there is no trainer class to choose"
                       if key == "type" else "a MindFormers model-zoo name")
    metric: Any = m.value(("metric",))
    if metric is not None:
        kinds = [x.get("type") for x in (metric if isinstance(metric, list) else [metric]) if isinstance(x, dict)]
        perplexity = bool(kinds) and all(k == "PerplexityMetric" for k in kinds)
        m.line(("metric",), "unneeded" if perplexity else "dropped",
               "mf's evaluation reports perplexity and token accuracy" if perplexity
               else "mf's evaluation reports perplexity and token accuracy only")
