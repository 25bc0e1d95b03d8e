"""The demo data the Trainer builds when it is missing, through mf-data's API (the same functions
as `mf data make-demo-corpus / train-tokenizer / preprocess / make-demo-sft / preprocess-sft`), so
the data is exactly what the CLI would make. Two pass-through keys of a dataloader ask for it:

    dataloader:
      config:
        data_path: ["1", "examples/tiny/cache/pydoc_text_document"]
      demo_corpus:            # build data_path (and tokenizer.path) from Python's pydoc topics
        vocab_size: 2000      #   if they are missing; otherwise use the cached files
    tokenizer:
      path: examples/tiny/cache/pydoc_spm.model

`demo_corpus`: when the `.bin/.idx` pair of the (single) data_path prefix is missing, the Trainer
writes the corpus (`mf-data make-demo-corpus`), trains the sentencepiece model at
`tokenizer.path` when that is missing too (`mf-data train-tokenizer`), and preprocesses with EOD
appended (`mf-data preprocess`). `demo_sft: {}` (with `datasets_type: SFTDataset` and one
`<name>_sft_document` prefix): mf-data's demo instruction set (questions and answers from Python's
help topics, `make_demo_sft`) tokenised with the existing `tokenizer.path` (the demo corpus's) at
`config.seq_length` (`preprocess_sft`), the tokens and their loss-mask channel. When the files
exist they are used as they are (and the log says so): the keys mean "build if missing", never
"ignore".

A demo writes only into its own cache directory: the directory of the data_path prefix, which
must not exist yet or hold nothing but what that demo writes there (corpus.jsonl / sft.jsonl, the
pairs, the tokenizer, mf-data's index cache). Half a pair (an `.idx` without its `.bin`, or the
reverse) is an error naming the missing file: it is a dataset someone made, not a demo to rebuild
over it.
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
SFT_DIR = "sft"   # the demo SFT set's usual cache: a subdirectory of the demo corpus's


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
           tokenizer.with_suffix(".vocab").name, SFT_DIR}
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




def _single_prefix(extra: dict, key: str, suffix: str, tool: str) -> str:
    config = extra.get("config") or {}
    data_path = config.get("data_path") if isinstance(config, dict) else None
    if not isinstance(data_path, list) or len(data_path) not in (1, 2):
        raise TrainerConfigError(f"train_dataset.dataloader.{key}: needs config.data_path with exactly one prefix "
                                 f"(e.g. ['1', 'cache/pydoc{suffix}']), got {data_path!r}")
    prefix = str(data_path[-1])
    if not prefix.endswith(suffix):
        raise TrainerConfigError(f"train_dataset.dataloader.config.data_path: the {key.replace('_', ' ')} is written as "
                                 f"'<name>{suffix}' ({tool} naming), got {prefix!r}")
    return prefix


def ensure_demo_sft(extra: dict, tokenizer_path: str) -> None:
    """Build the demo SFT data named by `extra['config']['data_path']` if it is missing."""
    if extra.get("demo_sft") not in (None, True, {}):
        raise TrainerConfigError("train_dataset.dataloader.demo_sft: takes no keys ({} or true): the conversations "
                                 "are mf-data's demo set, their length config.seq_length")
    prefix = _single_prefix(extra, "demo_sft", "_sft_document", "mf-data preprocess-sft")
    mask = mf_data.loss_mask_prefix(prefix)
    files = [prefix + ".bin", prefix + ".idx", mask + ".bin", mask + ".idx"]
    present = [os.path.isfile(f) for f in files]
    if all(present):
        log.info("demo SFT data: using the cached %s.{bin,idx} and its loss mask", prefix)
        return
    if any(present):
        missing = next(f for f, here in zip(files, present) if not here)
        raise TrainerConfigError(f"train_dataset.dataloader.config.data_path: {missing} is missing but other files of "
                                 f"{prefix} exist; the demo SFT data is built only where none exists (restore it, or "
                                 "remove dataloader.demo_sft to use your own data)")
    if not tokenizer_path or not os.path.isfile(tokenizer_path):
        raise TrainerConfigError(f"tokenizer.path: {tokenizer_path or '(empty)'} is missing; the demo SFT data is "
                                 "tokenised with an existing tokenizer (the demo corpus's: run mf train "
                                 "examples/tiny/train.yaml first)")
    cache = Path(prefix).parent
    name = Path(prefix).name
    own = {"sft.jsonl", "cache", *(Path(f).name for f in files), f"{name}.stats.json", f"{Path(mask).name}.stats.json"}
    if cache.exists() and not cache.is_dir():
        raise TrainerConfigError(f"train_dataset.dataloader.config.data_path: {cache} is not a directory")
    foreign = sorted(p.name for p in cache.iterdir() if p.name not in own and not p.name.startswith(".")) \
        if cache.is_dir() else []
    if foreign:
        raise TrainerConfigError(f"train_dataset.dataloader.config.data_path: {prefix} is missing and {cache} holds "
                                 f"other files ({', '.join(foreign[:3])}): the demo SFT data writes only into a "
                                 "directory of its own; point data_path at a new directory, or remove dataloader.demo_sft")
    cache.mkdir(parents=True, exist_ok=True)
    conversations = cache / "sft.jsonl"
    if not conversations.is_file():
        info = mf_data.make_demo_sft(str(cache))
        log.info("demo SFT data: %s conversations from pydoc_data.topics -> %s", info["conversations"], info["path"])
    seq = (extra.get("config") or {}).get("seq_length")
    summary = mf_data.preprocess_sft([str(conversations)], tokenizer_path, prefix[: -len("_sft_document")],
                                     seq_length=seq, progress=False, log=io.StringIO())
    log.info("demo SFT data: %s samples, %s tokens (%s trained on) -> %s", summary.get("samples"), summary.get("tokens"),
             summary.get("response_tokens"), prefix)


def prepare_demo_data(extra: dict, tokenizer_path: str, model_vocab: int | None) -> None:
    """Build what the demo keys of a dataloader mapping ask for, then drop those keys (in place):
    what is left goes to mf-data."""
    if "demo_corpus" in extra:
        ensure_demo_corpus(extra, tokenizer_path, model_vocab)
        check_eod(extra, tokenizer_path)
        extra.pop("demo_corpus")
    if "demo_sft" in extra:
        ensure_demo_sft(extra, tokenizer_path)
        extra.pop("demo_sft")
