"""`train_dataset` / `eval_dataset` (and their `*_task` wrappers), batch sizes and the step count.

The Megatron loader (`BlendedMegatronDatasetDataLoader`) is the same class in both formats: its
keys move from `data_loader` to `dataloader` unchanged. Other loaders (MindRecord, ...) cannot be
read by mf; the new config gets the Megatron loader and the report says to convert the corpus.

Batch: MindFormers trained `batch_size x data_parallel x gradient_accumulation_steps x
micro_batch_num (pipeline only) x micro_batch_interleave_num` samples per step; that product is
`training.global_batch_size`, `batch_size` is `training.local_batch_size`, and mf accumulates
global / (data_parallel x local) micro-batches. Steps: MindFormers ran `epochs x (samples /
global batch)` steps, data sinking or not; the sample count is known for the Megatron loader
(`sizes[0]`).
"""

from __future__ import annotations

import math
from typing import Any

from mf_config.errors import fmt_value
from mf_config.legacy.session import Migration
from mf_config.legacy.tables import DATASET, lookup

MEGATRON = "BlendedMegatronDatasetDataLoader"
_COLUMN_NAMES = {"input_ids": "input_ids", "labels": "labels", "target_ids": "labels", "loss_mask": "loss_mask",
                 "position_ids": "position_ids", "attention_mask": "attention_mask",
                 "actual_seq_len": "actual_seq_len"}
_SAME_PLACE = ("drop_remainder", "num_parallel_workers", "prefetch_size", "numa_enable")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def migrate_datasets(m: Migration) -> None:
    _dataset(m, "train_dataset")
    run_mode = m.value(("run_mode",), "train")
    do_eval = m.value(("do_eval",)) is True
    if m.src.mapping(("eval_dataset",)) and (do_eval or run_mode == "eval"):
        _dataset(m, "eval_dataset")
        _eval_interval(m, do_eval)
    else:
        for key in m.src.mapping(("eval_dataset",)):
            m.unneeded(("eval_dataset", key), "do_eval is off: the old run evaluated nothing")
        for key in ("eval_step_interval", "eval_epoch_interval"):
            if m.src.has((key,)):
                m.unneeded((key,), "do_eval is off")
    if m.src.has(("do_eval",)) and not m.src.is_handled(("do_eval",)):
        if do_eval and m.get_new("eval_dataset") is not None:
            m.translated(("do_eval",), "eval_dataset is kept; mf evaluates it every eval_dataset.eval_interval steps")
        else:
            m.unneeded(("do_eval",), "no evaluation data" if do_eval else "off")
    for task, section in (("train_dataset_task", "train_dataset"), ("eval_dataset_task", "eval_dataset")):
        for key, value in m.src.mapping((task,)).items():
            if key == "dataset_config":
                m.unneeded((task, key), f"a copy of {section}")
            elif key == "type" and value == "CausalLanguageModelDataset":
                m.unneeded((task, key), "mf's loaders produce causal-LM samples directly")
            else:
                m.dropped((task, key), "a MindFormers dataset wrapper with no equivalent in mf")
    _batch(m)
    _steps(m)


def _dataset(m: Migration, section: str) -> None:
    base = (section,)
    loader_path = (section, "data_loader")
    loader = m.src.mapping(loader_path)
    kind = loader.get("type")
    if kind == MEGATRON:
        for key, value in loader.items():
            m.set(f"{section}.dataloader.{key}", value)
            m.src.mark((*loader_path, key))
        m.line(loader_path, "translated", f"{section}.dataloader (the same loader and keys)", mark=False)
        config = loader.get("config") if isinstance(loader.get("config"), dict) else {}
        _megatron_columns(m, section, config)
        seed_path = (section, "seed")
        config = loader.get("config", {})
        if m.src.has(seed_path):
            if not isinstance(config, dict):
                m.dropped(seed_path, "the loader's config is not a mapping to put it in")
            elif "seed" in config or "random_seed" in config:
                m.unneeded(seed_path, "the loader's config gives its own seed")
            else:
                m.copy(seed_path, f"{section}.dataloader.config.seed")
    else:
        _foreign_loader(m, section, loader_path, loader)
    for key in _SAME_PLACE:
        if m.src.has((section, key)):
            m.copy((section, key), f"{section}.{key}")
    if m.src.has((section, "python_multiprocessing")):
        m.copy((section, "python_multiprocessing"), f"{section}.dataloader.python_multiprocessing")
    repeat = m.value((section, "repeat"))
    if repeat is not None:
        m.line((section, "repeat"), "unneeded" if repeat == 1 else "translated",
               "once through the data per epoch" if repeat == 1 else "counted in the samples of an epoch (training.steps)")
    if m.src.has((section, "batch_size")):
        if m.src.has(("runner_config", "batch_size")):
            m.unneeded((section, "batch_size"), "runner_config.batch_size overrides it (as in MindFormers)")
        else:
            m.src.mark((section, "batch_size"))  # the batch rule reports it
    m.drop_table(base, DATASET)


def megatron_columns(old: Any, config: dict) -> list[str]:
    """The column_names mf-data's Megatron loader yields for `config`: the old names it knows, in
    their order, then what the Trainer needs (labels, loss_mask); attention_mask exactly when
    config.create_attention_mask (mf-data's default True) makes one, since the loader refuses
    both a listed mask it does not build and a built mask that is not listed."""
    names = [lookup(_COLUMN_NAMES, c) for c in old if lookup(_COLUMN_NAMES, c)] if isinstance(old, list) else []
    names = [n for n in dict.fromkeys(names) if n not in ("attention_mask", "actual_seq_len")]
    for needed in ("input_ids", "labels", "loss_mask"):
        if needed not in names:
            names.append(needed)
    if config.get("create_attention_mask", True) is True:
        names.append("attention_mask")
    if config.get("create_compressed_eod_mask") is True:
        names.append("actual_seq_len")
    return names


def _megatron_columns(m: Migration, section: str, config: dict) -> None:
    path = (section, "input_columns")
    old = m.value(path)
    names = megatron_columns(old, config)
    m.set(f"{section}.dataloader.column_names", names)
    if m.src.has(path):
        note = "" if old == names else (" (what the Megatron loader yields for its config: the Trainer needs labels "
                                        "and loss_mask, and attention_mask is listed exactly when "
                                        "config.create_attention_mask builds it)")
        m.translated(path, f"{section}.dataloader.column_names: {fmt_value(names)}{note}")


_PREPROCESS = ("`mf data preprocess --input CORPUS.jsonl --tokenizer-model TOKENIZER.model --output-prefix PREFIX` "
               "(chat data: `mf data preprocess-sft --input DATA.jsonl --tokenizer DIR --output-prefix PREFIX`)")


def _foreign_loader(m: Migration, section: str, loader_path: tuple, loader: dict) -> None:
    kind = loader.get("type")
    m.set(f"{section}.dataloader.type", MEGATRON)
    m.set(f"{section}.dataloader.datasets_type", "GPTDataset")
    seq = m.get_new("model.seq_length")
    config: dict[str, Any] = {"split": "1, 0, 0", "create_attention_mask": False}  # the models' causal mask
    if _is_int(seq):
        config["seq_length"] = seq
    m.set(f"{section}.dataloader.config", config)
    where = loader.get("dataset_dir") or loader.get("dataset_files") or loader.get("path")
    place = f" ({fmt_value(where)})" if where else ""
    mindrecord = isinstance(kind, str) and "MindDataset" in kind or "mindrecord" in str(where).lower()
    what = f"MindRecord data{place} ({kind})" if mindrecord else f"{fmt_value(kind)} data{place}"
    m.action((*loader_path, "type") if "type" in loader else loader_path,
             f"{what} cannot be read by mf: convert the corpus it was made from with {_PREPROCESS}, then set "
             f"{section}.dataloader.config.data_path: [PREFIX_text_document] (and {section}.dataloader.sizes)",
             fix=f"{section}.dataloader.config.data_path")
    for key in loader:
        if key == "shuffle":
            m.copy((*loader_path, key), f"{section}.dataloader.shuffle")
        elif not m.src.is_handled((*loader_path, key)):
            m.unneeded((*loader_path, key), f"a setting of the {kind} loader, replaced by the Megatron loader")
    _megatron_columns(m, section, config)
    for key in ("seed",):
        if m.src.has((section, key)):
            m.dropped((section, key), "a seed of the replaced loader")


def _eval_interval(m: Migration, do_eval: bool) -> None:
    step = m.value(("eval_step_interval",))
    if do_eval and _is_int(step) and step > 0:
        m.copy(("eval_step_interval",), "eval_dataset.eval_interval", step)
    elif m.src.has(("eval_step_interval",)):
        m.unneeded(("eval_step_interval",), "no periodic evaluation")
    elif do_eval:
        m.set("eval_dataset.eval_interval", 100)
        m.line(("do_eval",), "translated", "eval_dataset.eval_interval: 100 (MindFormers' default "
               "eval_step_interval)")
    epoch = m.value(("eval_epoch_interval",))
    if epoch is not None:
        m.line(("eval_epoch_interval",), "unneeded" if not _is_int(epoch) or epoch <= 0 else "dropped",
               "mf evaluates every eval_dataset.eval_interval steps, not per epoch")


def _batch(m: Migration) -> None:
    f = m.facts
    runner = m.src.mapping(("runner_config",))
    bs_path = ("runner_config", "batch_size") if "batch_size" in runner else ("train_dataset", "batch_size")
    bs = m.value(bs_path, 1)
    if not _is_int(bs) or bs < 1:
        bs = 1
    ga_path = ("runner_config", "gradient_accumulation_steps")
    ga = m.value(ga_path, 1)
    ga = ga if _is_int(ga) and ga >= 1 else 1
    mbi = m.value(("micro_batch_interleave_num",), 1)
    mbi = mbi if _is_int(mbi) and mbi >= 1 else 1
    mbn = f.micro_batch_num if f.pipeline_parallel > 1 else 1
    factors = [("batch_size", bs), ("data_parallel", f.data_parallel), ("gradient_accumulation_steps", ga),
               ("micro_batch_num", mbn), ("micro_batch_interleave_num", mbi)]
    global_batch = math.prod(v for _, v in factors)
    f.local_batch_size, f.global_batch_size = bs, global_batch
    m.set("training.local_batch_size", bs)
    m.set("training.global_batch_size", global_batch)
    formula = " x ".join(f"{k} {v}" for k, v in factors if v != 1 or k == "batch_size")
    text = f"training.local_batch_size: {bs}; training.global_batch_size = {formula} = {global_batch}"
    if m.src.has(bs_path):
        m.translated(bs_path, text)
    else:
        m.line(("runner_config",), "translated", text + " (batch_size not given: 1)", mark=False)
    if m.src.has(ga_path):
        m.translated(ga_path, f"counted in training.global_batch_size ({global_batch}); mf accumulates "
                              "global_batch_size / (data_parallel x local_batch_size) micro-batches per step")
    mbn_path = ("parallel_config", "micro_batch_num")
    if m.src.has(mbn_path) and not m.src.is_handled(mbn_path):
        if f.pipeline_parallel > 1:
            m.translated(mbn_path, f"counted in training.global_batch_size ({global_batch}): mf's pipeline runs one "
                                   "micro-batch per accumulation step")
        else:
            m.unneeded(mbn_path, "used only with pipeline_stage > 1")


def _steps(m: Migration) -> None:
    f = m.facts
    epochs_path = ("runner_config", "epochs")
    epochs = m.value(epochs_path)
    sizes = m.get_new("train_dataset.dataloader.sizes")
    repeat = m.value(("train_dataset", "repeat"), 1)
    samples = sizes[0] if isinstance(sizes, list) and sizes and _is_int(sizes[0]) else None
    drop_last = m.value(("train_dataset", "drop_remainder"), True) is not False
    if _is_int(epochs) and epochs > 0 and samples and _is_int(repeat) and repeat > 0 and f.global_batch_size:
        per_epoch_samples = samples * repeat
        per_epoch = (per_epoch_samples // f.global_batch_size if drop_last
                     else math.ceil(per_epoch_samples / f.global_batch_size))
        if per_epoch >= 1:
            steps = epochs * per_epoch
            m.set("training.steps", steps)
            rounding = "//" if drop_last else "/ (rounded up)"
            repeats = f" x repeat {repeat}" if repeat != 1 else ""
            m.translated(epochs_path, f"training.steps = epochs {epochs} x ({samples} samples{repeats} {rounding} "
                                      f"global batch {f.global_batch_size} = {per_epoch} steps per epoch) = {steps}")
            return
    why = ("the number of samples per epoch is unknown (only the Megatron loader's sizes[0] says it)"
           if not samples else "an epoch holds fewer samples than one global batch" if _is_int(epochs) and epochs > 0
           else "runner_config.epochs is not a positive integer")
    m.set("training.steps", 1000)
    path = epochs_path if m.src.has(epochs_path) else ("runner_config",)
    m.line(path, "action", f"training.steps could not be derived ({why}): set it by hand (1000 is written)",
           mark=m.src.has(epochs_path), fix="training.steps")

