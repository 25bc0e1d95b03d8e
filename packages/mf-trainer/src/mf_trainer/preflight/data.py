"""The data sections against what the Trainer and the evaluator consume, from the config alone
(`column_names` and the `create_*` switches; whether the files exist is mf-data's business when
the loader is built), and the batch arithmetic against the data-parallel size."""

from __future__ import annotations

from mf_trainer.preflight.registry import EVAL, TRAINING, check

NEEDED_COLUMNS = ("input_ids", "labels", "loss_mask")
SPLITS = ("train", "valid", "test")
_EOD_REASON = "the compressed EOD mask needs a variable-length attention kernel that mf-models does not have"


def column_problems(section, where: str, consumer: str, context_parallel: int = 1):
    """(key, reason) lines for a dataset section whose samples `consumer` cannot use. Training
    under context_parallel > 1 takes the compressed EOD mask: the cp attention reads the packed
    documents as global document ids (mf_parallel.slice_for_context_parallel), no kernel needed."""
    dl = section.dataloader
    config = dl.extra.get("config") if isinstance(dl.extra.get("config"), dict) else {}
    compressed = config.get("create_compressed_eod_mask") or "actual_seq_len" in dl.column_names
    if compressed and context_parallel <= 1:
        yield (f"{where}.dataloader.config.create_compressed_eod_mask",
               _EOD_REASON + ("; it acts under parallelism.context_parallel > 1 (document ids in the cp attention), "
                              "else use create_attention_mask with reset_attention_mask"
                              if where == "train_dataset" else ""))
    missing = [c for c in NEEDED_COLUMNS if c not in dl.column_names]
    if missing:
        yield f"{where}.dataloader.column_names", f"{consumer} needs {', '.join(repr(c) for c in missing)}"


def eval_data(cfg) -> tuple[object, str, str]:
    """(dataset section, its YAML name, split phase) this config evaluates on; ValueError (one
    `key: reason` line) when the sizes do not name one split."""
    if cfg.eval_dataset is not None:
        sizes = cfg.eval_dataset.dataloader.extra.get("sizes")
        chosen = [i for i, n in enumerate(sizes or ()) if n != 0] if isinstance(sizes, list) else []
        if not isinstance(sizes, list) or len(chosen) != 1:
            raise ValueError(
                f"eval_dataset.dataloader.sizes: name the split to evaluate by giving exactly one split a non-zero size "
                f"(e.g. [1000, 0, 0] with split '1,0,0', or [0, 300, 0] for the valid split), got {sizes!r}")
        return cfg.eval_dataset, "eval_dataset", SPLITS[chosen[0]]
    sizes = cfg.train_dataset.dataloader.extra.get("sizes")
    if not isinstance(sizes, list) or len(sizes) != 3 or not sizes[1]:
        raise ValueError(
            f"train_dataset.dataloader.sizes: evaluating the valid split needs sizes[1] > 0 (and a split string giving "
            f"it documents, e.g. '969,30,1'), got {sizes!r}; or give an eval_dataset section")
    return cfg.train_dataset, "train_dataset", "valid"


@check()
def training_columns(t):
    """train_dataset yields the columns the Trainer needs."""
    cp = t.layout.cp if t.layout is not None else 1
    yield from column_problems(t.cfg.train_dataset, "train_dataset", "the Trainer", cp)


@check(commands=(*TRAINING, EVAL))
def evaluation_data(t):
    """The evaluation data names one split with the columns evaluation needs."""
    if t.command != EVAL and t.cfg.eval_dataset is None:
        return
    from mf_trainer.preflight.registry import split_line

    try:
        section, where, _ = eval_data(t.cfg)
    except ValueError as exc:
        yield split_line(str(exc), "eval_dataset")
        return
    if t.command == EVAL or where == "eval_dataset":
        yield from column_problems(section, where, "evaluation")


def accumulation(training, dp: int) -> int:
    """Micro-batches per optimizer step: global_batch_size // (dp x local_batch_size)."""
    return training.global_batch_size // (dp * training.local_batch_size)


@check(needs=("world",))
def global_batch(t):
    """global_batch_size holds one micro-batch per data-parallel rank."""
    if t.dims is None:
        return
    tr, dp = t.cfg.training, t.dims.dp
    per_micro = dp * tr.local_batch_size
    if per_micro > tr.global_batch_size:
        yield ("training.global_batch_size", f"{tr.global_batch_size} is below data_parallel ({dp}) x "
                                             f"local_batch_size ({tr.local_batch_size}) = {per_micro}")


_BLEND_KEYS = ("data_path", "train_data_path", "valid_data_path", "test_data_path")


def dataset_prefixes(section) -> list[tuple[str, str]]:
    """(config key, prefix) of every Megatron dataset a loader section opens: each component of a
    blend (`data_path: [w, prefix, ...]`) and of the per-split paths."""
    import mf_config

    config = section.dataloader.extra.get("config")
    if section.dataloader.type != "BlendedMegatronDatasetDataLoader" or not isinstance(config, dict):
        return []
    out = []
    for key in _BLEND_KEYS:
        value = config.get(key)
        if value is None:
            continue
        try:
            prefixes, _ = mf_config.split_data_path(value if isinstance(value, list) else [value], key)
        except mf_config.ConfigError:
            continue   # mf-config / mf-data name a malformed list
        out += [(key, str(p)) for p in prefixes]
    return out


def token_range_problems(cfg, vocab_size: int, sections, cache: bool = True):
    """(key, reason) for each dataset (of `sections`: (YAML name, section)) holding a token id
    outside [0, vocab_size). Missing or damaged files are the loader's to report, not this."""
    import os

    import mf_data

    seen = set()
    for where, section in sections:
        for key, prefix in dataset_prefixes(section):
            if prefix in seen or not (os.path.isfile(prefix + ".bin") and os.path.isfile(prefix + ".idx")):
                continue
            seen.add(prefix)
            try:
                found = mf_data.token_range(prefix, cache=cache)
            except (mf_data.MFDataError, OSError, ValueError):
                continue
            if found is not None and (found.min < 0 or found.max >= vocab_size):
                yield (f"{where}.dataloader.config.{key}",
                       f"{prefix} holds token ids {found.min}..{found.max}, outside model.vocab_size {vocab_size} "
                       f"(ids 0..{vocab_size - 1}): it was tokenised for another vocabulary; re-tokenise it or "
                       f"raise model.vocab_size above {found.max}")


@check(commands=(*TRAINING, EVAL), needs=("files",))
def token_ids_fit_the_vocabulary(t):
    """Every dataset's token ids are below model.vocab_size."""
    args = t.model_args
    vocab = getattr(args, "vocab_size", None)
    if not isinstance(vocab, int):
        return
    if t.command == EVAL:
        try:
            section, where, _ = eval_data(t.cfg)
        except ValueError:
            return       # evaluation_data reports it
        sections = [(where, section)]
    else:
        sections = [("train_dataset", t.cfg.train_dataset)]
        if t.cfg.eval_dataset is not None:
            sections.append(("eval_dataset", t.cfg.eval_dataset))
    yield from token_range_problems(t.cfg, vocab, sections, cache=not t.plan_only)
