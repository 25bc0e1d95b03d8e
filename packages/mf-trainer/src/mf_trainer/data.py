"""The YAML `train_dataset` section -> mf-data's framework-free loader, and the demo corpus.

The mapping is one to one: `dataloader.{type, datasets_type, sizes, config, column_names, shuffle,
python_multiprocessing}` and `train_dataset.{drop_remainder, num_parallel_workers, prefetch_size,
numa_enable}` go to `BlendedMegatronDatasetDataLoader` under the same names; the run adds
`dp_rank`, `dp_size`, `micro_batch_size` (= training.local_batch_size) and `consumed_samples`.
mf-data honours or rejects each of them.

One pass-through key is the Trainer's own, `dataloader.demo_corpus`:

    dataloader:
      config:
        data_path: ["1", "examples/tiny/cache/pydoc_text_document"]
      demo_corpus:            # build data_path (and tokenizer.path) from Python's pydoc topics
        vocab_size: 2000      #   if they are missing; otherwise use the cached files
    tokenizer:
      path: examples/tiny/cache/pydoc_spm.model

When the `.bin/.idx` pair of the (single) data_path prefix is missing, the Trainer writes the
corpus (`mf-data make-demo-corpus`), trains the sentencepiece model at `tokenizer.path` when that
is missing too (`mf-data train-tokenizer`), and preprocesses with EOD appended
(`mf-data preprocess`), all through mf-data, so the data is exactly what the CLI would make.
When the files exist they are used as they are (and the log says so): the key means "build if
missing", never "ignore".

The fallback writes only into the demo's own cache directory: the directory of the data_path
prefix, which must not exist yet or hold nothing but what the demo writes there (corpus.jsonl,
the pair, its tokenizer, mf-data's index cache). Half a pair (an `.idx` without its `.bin`, or
the reverse) is an error naming the missing file: it is a dataset someone made, not a demo to
rebuild over it.
"""

from __future__ import annotations

import io
import logging
import os
from pathlib import Path
from typing import Any

import mf_data
from mf_trainer.errors import TrainerConfigError

log = logging.getLogger("mf_trainer")

DEMO_KEYS = {"vocab_size": 2000}


def _demo_settings(value: Any) -> dict:
    if value is True or value is None:
        value = {}
    if not isinstance(value, dict):
        raise TrainerConfigError(f"train_dataset.dataloader.demo_corpus: must be a mapping, got {value!r}")
    unknown = sorted(set(value) - set(DEMO_KEYS))
    if unknown:
        raise TrainerConfigError(f"train_dataset.dataloader.demo_corpus.{unknown[0]}: unknown key; accepted: "
                                 f"{', '.join(DEMO_KEYS)}")
    settings = {**DEMO_KEYS, **value}
    vocab = settings["vocab_size"]
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 16:
        raise TrainerConfigError(f"train_dataset.dataloader.demo_corpus.vocab_size: must be an integer >= 16, got {vocab!r}")
    return settings


def ensure_demo_corpus(extra: dict, tokenizer_path: str, model_vocab: int | None) -> None:
    """Build the demo data named by `extra['config']['data_path']` if it is missing."""
    settings = _demo_settings(extra.get("demo_corpus"))
    config = extra.get("config") or {}
    data_path = config.get("data_path") if isinstance(config, dict) else None
    if not isinstance(data_path, list) or len(data_path) not in (1, 2):
        raise TrainerConfigError("train_dataset.dataloader.demo_corpus: needs config.data_path with exactly one "
                                 f"prefix (e.g. ['1', 'cache/pydoc_text_document']), got {data_path!r}")
    prefix = str(data_path[-1])
    if not prefix.endswith("_text_document"):
        raise TrainerConfigError(f"train_dataset.dataloader.config.data_path: the demo corpus is written as "
                                 f"'<name>_text_document' (mf-data preprocess naming), got {prefix!r}")
    if not tokenizer_path:
        raise TrainerConfigError("tokenizer.path: the demo corpus needs it (where its sentencepiece model lives)")
    vocab = settings["vocab_size"]
    if model_vocab is not None and vocab > model_vocab:
        raise TrainerConfigError(f"train_dataset.dataloader.demo_corpus.vocab_size: {vocab} exceeds "
                                 f"model.vocab_size {model_vocab}")
    have_bin, have_idx = os.path.isfile(prefix + ".bin"), os.path.isfile(prefix + ".idx")
    if have_bin != have_idx:
        missing, present = (prefix + ".bin", prefix + ".idx") if have_idx else (prefix + ".idx", prefix + ".bin")
        raise TrainerConfigError(f"train_dataset.dataloader.config.data_path: {missing} is missing but {present} "
                                 "exists; the demo corpus is built only where neither file exists (restore the "
                                 "missing file, or remove dataloader.demo_corpus to use your own data)")
    have_data = have_bin and have_idx
    if have_data and os.path.isfile(tokenizer_path):
        log.info("demo corpus: using the cached %s.{bin,idx} and %s", prefix, tokenizer_path)
        return
    if have_data:
        raise TrainerConfigError(f"tokenizer.path: {tokenizer_path} is missing but {prefix}.bin exists; the data "
                                 "and tokenizer belong together: delete both to rebuild")
    cache = Path(prefix).parent
    _check_demo_cache(cache, prefix, tokenizer_path)
    cache.mkdir(parents=True, exist_ok=True)
    corpus = cache / "corpus.jsonl"
    if not corpus.is_file():
        info = mf_data.make_demo_corpus(str(cache))
        log.info("demo corpus: %s documents from pydoc_data.topics -> %s", info["documents"], info["path"])
    if not os.path.isfile(tokenizer_path):
        Path(tokenizer_path).parent.mkdir(parents=True, exist_ok=True)
        mf_data.train_sentencepiece([str(corpus)], tokenizer_path, vocab)
        log.info("demo corpus: trained a %d-piece sentencepiece model -> %s", vocab, tokenizer_path)
    # Written under a temporary name, then renamed (.idx last, the file whose presence counts):
    # an interrupted build never leaves a pair that looks complete.
    name = Path(prefix).name[: -len("_text_document")]
    staging = str(cache / f".building-{os.getpid()}-{name}")
    summary = mf_data.preprocess([str(corpus)], tokenizer_path, staging, append_eod=True,
                                 workers=1, overwrite=True, progress=False, log=io.StringIO())
    if os.path.isfile(staging + "_text_document.stats.json"):  # its token range (still valid: renames keep mtimes)
        os.replace(staging + "_text_document.stats.json", prefix + ".stats.json")
    os.replace(staging + "_text_document.bin", prefix + ".bin")
    os.replace(staging + "_text_document.idx", prefix + ".idx")
    tokens = summary.get("tokens")
    tokens = sum(tokens.values()) if isinstance(tokens, dict) else tokens
    log.info("demo corpus: %s documents, %s tokens -> %s.{bin,idx}", summary.get("documents"), tokens, prefix)


def _check_demo_cache(cache: Path, prefix: str, tokenizer_path: str) -> None:
    """The directory the demo is about to write into must be the demo's own (see the module doc)."""
    name = Path(prefix).name
    tokenizer = Path(tokenizer_path)
    if not os.path.isfile(tokenizer_path) and os.path.realpath(tokenizer.parent) != os.path.realpath(cache):
        raise TrainerConfigError(f"tokenizer.path: {tokenizer_path} is missing; the demo corpus trains it only inside "
                                 f"its own cache directory {cache} (beside data_path)")
    if not cache.exists():
        return
    if not cache.is_dir():
        raise TrainerConfigError(f"train_dataset.dataloader.config.data_path: {cache} is not a directory")
    own = {"corpus.jsonl", "cache", f"{name}.bin", f"{name}.idx", f"{name}.stats.json", tokenizer.name,
           tokenizer.with_suffix(".vocab").name}
    foreign = sorted(p.name for p in cache.iterdir() if p.name not in own and not p.name.startswith("."))
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" (and {len(foreign) - 3} more)" if len(foreign) > 3 else "")
        raise TrainerConfigError(f"train_dataset.dataloader.config.data_path: {prefix}.bin/.idx are missing and {cache} "
                                 f"holds other files ({shown}): the demo corpus writes only into a directory of its "
                                 "own; point data_path at a new directory, or remove dataloader.demo_corpus")


def check_eod(extra: dict, tokenizer_path: str) -> None:
    """The demo's config.eod must be the id its tokenizer appended, else the masks would be wrong."""
    eod = (extra.get("config") or {}).get("eod")
    actual = mf_data.SentencePieceTokenizer(tokenizer_path).eod
    if eod is not None and eod != actual:
        raise TrainerConfigError(f"train_dataset.dataloader.config.eod: {eod} is not the end-of-document id of "
                                 f"{tokenizer_path} ({actual})")


def build_loader(cfg, *, micro_batch_size: int, dp_rank: int = 0, dp_size: int = 1, consumed_samples: int = 0,
                 section=None, where: str = "train_dataset", phase: str = "train", is_built_on_rank=None):
    """The mf-data loader for this run (see the module docstring for the mapping): of
    `train_dataset`, or of `section` (named `where` in errors, e.g. `eval_dataset`), split `phase`.
    `is_built_on_rank`: in a parallel run, the rank that writes mf-data's index caches (the others
    wait for them)."""
    section = cfg.train_dataset if section is None else section
    dl = section.dataloader
    extra = dict(dl.extra)
    if "demo_corpus" in extra:
        ensure_demo_corpus(extra, cfg.tokenizer.path, cfg.model.extra.get("vocab_size"))
        check_eod(extra, cfg.tokenizer.path)
        extra.pop("demo_corpus")
    loader_cls = mf_data.BlendedMegatronDatasetDataLoader
    kwargs = dict(
        type=dl.type, column_names=dl.column_names, shuffle=dl.shuffle,
        python_multiprocessing=dl.python_multiprocessing, drop_remainder=section.drop_remainder,
        num_parallel_workers=section.num_parallel_workers, prefetch_size=section.prefetch_size,
        numa_enable=section.numa_enable, dp_rank=dp_rank, dp_size=dp_size, micro_batch_size=micro_batch_size,
        consumed_samples=consumed_samples,
    )
    if is_built_on_rank is not None:
        kwargs["is_built_on_rank"] = is_built_on_rank
    if phase != "train":
        kwargs["phase"] = phase
    clash = sorted(set(extra) & set(kwargs))
    if clash:
        raise TrainerConfigError(f"{where}.dataloader.{clash[0]}: set by the Trainer; remove it")
    try:
        return loader_cls(**kwargs, **extra)
    except TypeError as exc:
        raise TrainerConfigError(f"{where}.dataloader: {exc}") from None
    except mf_data.MFDataError as exc:
        raise TrainerConfigError(f"{where}.dataloader: {exc}") from None
