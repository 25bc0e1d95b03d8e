"""The YAML `train_dataset` section -> mf-data's framework-free loader.

The mapping is one to one: `dataloader.{type, datasets_type, sizes, config, column_names, shuffle,
python_multiprocessing}` and `train_dataset.{drop_remainder, num_parallel_workers, prefetch_size,
numa_enable}` go to `BlendedMegatronDatasetDataLoader` under the same names; the run adds
`dp_rank`, `dp_size`, `micro_batch_size` (= training.local_batch_size) and `consumed_samples`.
mf-data honours or rejects each of them. Two pass-through keys are the Trainer's own,
`dataloader.demo_corpus` and `dataloader.demo_sft` (build the demo data if missing: demo_data.py).
mf-data's log lines while a loader is built say which section they are about
(`[mf_data] eval_dataset (valid split): built GPTDataset valid indices ...`).
"""

from __future__ import annotations

import contextlib
import logging

import mf_data
from mf_trainer.demo_data import prepare_demo_data
from mf_trainer.errors import TrainerConfigError

log = logging.getLogger("mf_trainer")


class _Label(logging.Filter):
    """Prefixes mf-data's lines with the YAML section whose loader is being built."""

    def __init__(self, label: str):
        super().__init__()
        self.label = label

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = f"{self.label}: {record.getMessage()}", ()
        return True


@contextlib.contextmanager
def labelled(label: str):
    """While building a loader, mf-data's log lines say which dataset they are about
    (`[mf_data] eval_dataset: built GPTDataset valid indices ...`)."""
    logger = logging.getLogger("mf_data")
    label_filter = _Label(label)
    logger.addFilter(label_filter)
    try:
        yield
    finally:
        logger.removeFilter(label_filter)


def build_loader(cfg, *, micro_batch_size: int, dp_rank: int = 0, dp_size: int = 1, consumed_samples: int = 0,
                 section=None, where: str = "train_dataset", phase: str = "train", is_built_on_rank=None):
    """The mf-data loader for this run (see the module docstring for the mapping): of
    `train_dataset`, or of `section` (named `where` in errors, e.g. `eval_dataset`), split `phase`.
    `is_built_on_rank`: in a parallel run, the rank that writes mf-data's index caches (the others
    wait for them)."""
    section = cfg.train_dataset if section is None else section
    dl = section.dataloader
    extra = dict(dl.extra)
    prepare_demo_data(extra, cfg.tokenizer.path, cfg.model.extra.get("vocab_size"))   # pops the demo keys
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
    label = where if phase == "train" else f"{where} ({phase} split)"
    try:
        with labelled(label):
            return loader_cls(**kwargs, **extra)
    except TypeError as exc:
        raise TrainerConfigError(f"{where}.dataloader: {exc}") from None
    except mf_data.MFDataError as exc:
        raise TrainerConfigError(f"{where}.dataloader: {exc}") from None
