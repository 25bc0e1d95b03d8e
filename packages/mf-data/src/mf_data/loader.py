"""`BlendedMegatronDatasetDataLoader`: numpy micro-batches for one data-parallel rank.

`datasets_type` picks the dataset: `GPTDataset` (pretraining windows) or `SFTDataset` (packed
supervised samples with a loss-mask channel, `mf_data.sft_dataset`); both yield the same columns
and share everything below.

Built from the values of the training YAML's `train_dataset` block (see `build_from_yaml_block`)
or from a dataset directly. Iterating yields dicts `{column: array[micro_batch_size, ...]}` in
Megatron's pretraining-sampler order (`mf_data.sampler`), assembled ahead of time by worker
threads (or processes). The loader is a resumable stream: its whole state is
`consumed_samples`, the number of samples of the global order already handed out (counted for
all ranks, so it equals step * global_batch_size), and iterating again continues from there.

Field semantics (everything is honoured or rejected):

* `shuffle=False`: Megatron's order (the dataset is already shuffled by its shuffle index).
  `shuffle=True`: the global sample order is additionally permuted by a fixed permutation seeded
  with the config's seed (as MindFormers' `GeneratorDataset(shuffle=True)` adds a shuffle); it is
  a pure function of the seed and the dataset length, so `consumed_samples` still pins the
  position and resuming on any data-parallel size continues the same order.
* `drop_remainder=True`: a last global step with fewer than micro_batch_size * dp_size samples is
  dropped (Megatron's `drop_last`). False: it is kept and every rank's micro-batch is filled up
  with Megatron's batch-padding sample (sample 0 with an all-zero loss mask), so all ranks run
  the same number of steps with the same shapes and the padding adds nothing to the loss.
* `num_parallel_workers`: worker threads (processes with `python_multiprocessing`); 0 builds
  batches in the calling thread. `prefetch_size`: micro-batches kept ready per worker.
* `column_names`: the columns and their order; unknown names are errors, and so are
  `attention_mask` / `actual_seq_len` without (or, when not listed, with) the config switch that
  creates them.
* `numa_enable` must be False: NUMA pinning belongs to MindSpore's dataset engine, which this
  loader does not use.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from .builder import BlendedMegatronDatasetBuilder
from .config import GPTDatasetConfig
from .errors import DatasetConfigError, DatasetTooSmallError
from .gpt_dataset import GPTDataset
from .loader_config import gpt_config_from_dict, suggest
from .prefetch import prefetched
from .sampler import MegatronPretrainingSampler
from .samples import COLUMNS
from .sft_config import SFTDatasetConfig, sft_config_from_dict
from .sft_dataset import SFTDataset
from .utils import Split, as_split

logger = logging.getLogger("mf_data")

LOADER_TYPE = "BlendedMegatronDatasetDataLoader"
# datasets_type -> (dataset class, its config class, YAML mapping -> config)
DATASET_TYPES: dict[str, tuple[type, type, Callable[..., Any]]] = {
    "GPTDataset": (GPTDataset, GPTDatasetConfig, gpt_config_from_dict),
    "SFTDataset": (SFTDataset, SFTDatasetConfig, sft_config_from_dict),
}
SUPPORTED_DATASET_TYPES = tuple(DATASET_TYPES)
_BASE_COLUMNS = ("input_ids", "labels", "loss_mask", "position_ids")


def _int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise DatasetConfigError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise DatasetConfigError(f"{name} must be true or false, got {value!r}")
    return bool(value)


def dataset_config(datasets_type: str, config: Any, where: str = "config") -> Any:
    """The config object `datasets_type` needs, from a YAML mapping or an instance of its class."""
    if datasets_type not in DATASET_TYPES:
        raise DatasetConfigError(
            f"datasets_type: one of {', '.join(SUPPORTED_DATASET_TYPES)} is supported, got {datasets_type!r}"
            f"{suggest(str(datasets_type), SUPPORTED_DATASET_TYPES)}"
        )
    _, config_cls, from_dict = DATASET_TYPES[datasets_type]
    if isinstance(config, Mapping):
        return from_dict(config, where=where)
    if not isinstance(config, config_cls):
        raise DatasetConfigError(
            f"datasets_type {datasets_type!r} needs a {config_cls.__name__} (or a mapping), got {type(config).__name__}"
        )
    return config


def resolve_columns(column_names: Sequence[str] | None, config: Any) -> tuple[str, ...]:
    """Check `column_names` against what the config produces; None means all of it."""
    produced = list(_BASE_COLUMNS)
    if config.create_attention_mask:
        produced.append("attention_mask")
    if config.create_compressed_eod_mask:
        produced.append("actual_seq_len")
    if column_names is None:
        return tuple(produced)
    if isinstance(column_names, str) or not isinstance(column_names, Sequence) or not column_names:
        raise DatasetConfigError(f"column_names must be a non-empty list of column names, got {column_names!r}")
    seen: set[str] = set()
    for name in column_names:
        if name not in COLUMNS:
            raise DatasetConfigError(f"column_names: unknown column {name!r}{suggest(str(name), COLUMNS)}; known: {', '.join(COLUMNS)}")
        if name in seen:
            raise DatasetConfigError(f"column_names: {name!r} is listed twice")
        seen.add(name)
    for column, switch in (("attention_mask", "create_attention_mask"), ("actual_seq_len", "create_compressed_eod_mask")):
        on = getattr(config, switch)
        if column in seen and not on:
            raise DatasetConfigError(f"column_names lists {column!r} but config.{switch} is False: set it to True")
        if on and column not in seen:
            raise DatasetConfigError(
                f"config.{switch} is True but column_names does not list {column!r}: add the column or set {switch} to False"
            )
    return tuple(column_names)


class _BatchMaker:
    """Picklable callable turning one step's sample indices into a micro-batch."""

    def __init__(self, dataset: Any, columns: tuple[str, ...], order: np.ndarray | None, micro_batch_size: int) -> None:
        self.dataset = dataset
        self.columns = columns
        self.order = order
        self.micro_batch_size = micro_batch_size

    def __call__(self, indices: list[int]) -> dict[str, np.ndarray]:
        idx = np.asarray(indices, dtype=np.int64)
        if self.order is not None:
            idx = self.order[idx]
        if idx.size:
            batch = self.dataset.get_batch(idx)
        else:
            batch = {}
        missing = self.micro_batch_size - idx.size
        if missing:
            pad = self.dataset.padding_sample()
            batch = {
                k: np.concatenate([batch[k], np.repeat(pad[k][None], missing, axis=0)]) if batch else np.repeat(pad[k][None], missing, axis=0)
                for k in pad
            }
        return {name: batch[name] for name in self.columns}


class BlendedMegatronDatasetDataLoader:
    """Framework-free loader over Megatron datasets, for one data-parallel rank.

    Keyword names follow the YAML: `datasets_type`, `sizes`, `config` (a mapping with the YAML's
    keys, or the `GPTDatasetConfig` / `SFTDatasetConfig` of `datasets_type`), `column_names`, `shuffle`, `python_multiprocessing` from
    `train_dataset.dataloader`; `drop_remainder`, `num_parallel_workers`, `prefetch_size`,
    `numa_enable` from `train_dataset`; then the run's `dp_rank`, `dp_size`,
    `micro_batch_size`, `consumed_samples`. `phase` picks the split (train, valid, test),
    `is_built_on_rank` the rank(s) that write the index caches. Instead of `config`/`sizes`, an
    already built `dataset` (GPTDataset, SFTDataset or a BlendedDataset of them) may be given.
    """

    def __init__(
        self,
        datasets_type: str = "GPTDataset",
        sizes: Sequence[int | None] | None = None,
        config: Mapping[str, Any] | GPTDatasetConfig | SFTDatasetConfig | None = None,
        column_names: Sequence[str] | None = None,
        shuffle: bool = False,
        python_multiprocessing: bool = False,
        *,
        drop_remainder: bool = True,
        num_parallel_workers: int = 8,
        prefetch_size: int = 1,
        numa_enable: bool = False,
        dp_rank: int = 0,
        dp_size: int = 1,
        micro_batch_size: int = 1,
        consumed_samples: int = 0,
        phase: str | Split = "train",
        is_built_on_rank: Callable[[], bool] | None = None,
        dataset: Any = None,
        type: str | None = None,  # the YAML key, accepted so a dataloader block can be splatted
        mp_start_method: str | None = None,
    ) -> None:
        if type is not None and type != LOADER_TYPE:
            raise DatasetConfigError(f"type: this loader is {LOADER_TYPE!r}, got {type!r}")
        if datasets_type not in SUPPORTED_DATASET_TYPES:
            dataset_config(datasets_type, config)  # raises the one-line error
        self.shuffle = _bool("shuffle", shuffle)
        self.python_multiprocessing = _bool("python_multiprocessing", python_multiprocessing)
        self.drop_remainder = _bool("drop_remainder", drop_remainder)
        self.num_parallel_workers = _int("num_parallel_workers", num_parallel_workers, 0)
        self.prefetch_size = _int("prefetch_size", prefetch_size, 1)
        if _bool("numa_enable", numa_enable):
            raise DatasetConfigError(
                "numa_enable: NUMA binding is a feature of MindSpore's dataset engine, which mf-data's "
                "loader does not use; set it to False"
            )
        if self.python_multiprocessing and self.num_parallel_workers == 0:
            raise DatasetConfigError("python_multiprocessing needs num_parallel_workers >= 1")
        self.dp_size = _int("dp_size", dp_size, 1)
        self.dp_rank = _int("dp_rank", dp_rank, 0)
        if self.dp_rank >= self.dp_size:
            raise DatasetConfigError(f"dp_rank {dp_rank} must be below dp_size {dp_size}")
        self.micro_batch_size = _int("micro_batch_size", micro_batch_size, 1)
        self.phase = as_split(phase)
        self.mp_start_method = mp_start_method

        if dataset is None:
            if config is None or sizes is None:
                raise DatasetConfigError("give config and sizes (or an already built dataset)")
            gpt_config = dataset_config(datasets_type, config)
            if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence):
                raise DatasetConfigError(f"sizes must be a list [train, valid, test], got {sizes!r}")
            dataset_cls = DATASET_TYPES[datasets_type][0]
            splits = BlendedMegatronDatasetBuilder(dataset_cls, list(sizes), is_built_on_rank, gpt_config).build()
            dataset = splits[self.phase.value]
            if dataset is None:
                why = (f"split {gpt_config.split!r} gives it no documents" if gpt_config.blend_per_split is None
                       else f"no {self.phase.name}_data_path is given")
                raise DatasetTooSmallError(f"the {self.phase.name} split is empty: {why}")
        else:
            gpt_config = dataset.config
        self.dataset = dataset
        self.config: GPTDatasetConfig | SFTDatasetConfig = gpt_config
        self.columns = resolve_columns(column_names, gpt_config)
        self.total_samples = len(dataset)
        if self.total_samples == 0:
            raise DatasetTooSmallError(f"the {self.phase.name} dataset has no samples: it is too small for one sample of {gpt_config.sequence_length} tokens")
        global_micro = self.micro_batch_size * self.dp_size
        if self.drop_remainder and self.total_samples < global_micro:
            raise DatasetTooSmallError(
                f"the {self.phase.name} dataset has {self.total_samples} samples, fewer than one step of "
                f"micro_batch_size x dp_size = {global_micro} (and drop_remainder drops partial steps)"
            )
        self._order = None
        if self.shuffle:
            self._order = np.random.default_rng([gpt_config.random_seed, 0x5F]).permutation(self.total_samples)
        self._maker = _BatchMaker(dataset, self.columns, self._order, self.micro_batch_size)
        self._consumed = 0
        self._generation = 0
        self.load_state_dict({"consumed_samples": consumed_samples})

    # --- state ----------------------------------------------------------------------------------
    @property
    def consumed_samples(self) -> int:
        return self._consumed

    def state_dict(self) -> dict[str, int]:
        """`{"consumed_samples": n}`: samples of the global order handed out so far (all ranks)."""
        return {"consumed_samples": self._consumed}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from `state["consumed_samples"]`; a running iterator stops."""
        unknown = set(state) - {"consumed_samples"}
        if unknown:
            raise DatasetConfigError(f"loader state: unknown keys {sorted(unknown)} (only consumed_samples)")
        consumed = _int("consumed_samples", state.get("consumed_samples"), 0)
        if consumed > self.total_samples:
            raise DatasetConfigError(f"consumed_samples {consumed} exceeds the {self.total_samples} samples of the dataset")
        self._consumed = consumed
        self._generation += 1

    # --- iteration ------------------------------------------------------------------------------
    def _sampler(self) -> MegatronPretrainingSampler:
        return MegatronPretrainingSampler(
            self.total_samples, self._consumed, self.micro_batch_size, self.dp_rank, self.dp_size, self.drop_remainder
        )

    def __len__(self) -> int:
        """Micro-batches this rank still yields."""
        return len(self._sampler())

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        generation = self._generation
        step = self.micro_batch_size * self.dp_size
        batches = prefetched(
            self._maker,
            self._sampler(),
            self.num_parallel_workers,
            max(1, self.num_parallel_workers) * self.prefetch_size,
            processes=self.python_multiprocessing,
            start_method=self.mp_start_method,
        )
        try:
            for batch in batches:
                if generation != self._generation:
                    return
                self._consumed = min(self._consumed + step, self.total_samples)
                yield batch
        finally:
            batches.close()


_BLOCK_KEYS = ("dataloader", "drop_remainder", "num_parallel_workers", "prefetch_size", "numa_enable")
_DATALOADER_KEYS = ("type", "datasets_type", "sizes", "config", "column_names", "shuffle", "python_multiprocessing")


def build_from_yaml_block(
    train_dataset: Mapping[str, Any],
    *,
    dp_rank: int = 0,
    dp_size: int = 1,
    micro_batch_size: int = 1,
    consumed_samples: int = 0,
    phase: str | Split = "train",
    is_built_on_rank: Callable[[], bool] | None = None,
) -> BlendedMegatronDatasetDataLoader:
    """The loader for the YAML's `train_dataset` mapping (`dataloader:` block and its siblings)."""
    where = "train_dataset"
    if not isinstance(train_dataset, Mapping):
        raise DatasetConfigError(f"{where} must be a mapping, got {type(train_dataset).__name__}")
    for key in train_dataset:
        if key not in _BLOCK_KEYS:
            raise DatasetConfigError(f"{where}.{key}: unknown key{suggest(str(key), _BLOCK_KEYS)}")
    block = train_dataset.get("dataloader")
    if not isinstance(block, Mapping):
        raise DatasetConfigError(f"{where}.dataloader: required mapping (type: {LOADER_TYPE}, ...)")
    for key in block:
        if key not in _DATALOADER_KEYS:
            raise DatasetConfigError(f"{where}.dataloader.{key}: unknown key{suggest(str(key), _DATALOADER_KEYS)}")
    if block.get("type", LOADER_TYPE) != LOADER_TYPE:
        raise DatasetConfigError(f"{where}.dataloader.type: only {LOADER_TYPE} is provided by mf-data, got {block.get('type')!r}")
    if "sizes" not in block or "config" not in block:
        raise DatasetConfigError(f"{where}.dataloader: needs sizes and config")
    config = block["config"]
    if isinstance(config, Mapping):
        config = dataset_config(block.get("datasets_type", "GPTDataset"), config, where=f"{where}.dataloader.config")
    kwargs = {k: block[k] for k in ("datasets_type", "column_names", "shuffle", "python_multiprocessing") if k in block}
    kwargs.update({k: train_dataset[k] for k in _BLOCK_KEYS[1:] if k in train_dataset})
    try:
        return BlendedMegatronDatasetDataLoader(
            sizes=block["sizes"], config=config, dp_rank=dp_rank, dp_size=dp_size, micro_batch_size=micro_batch_size,
            consumed_samples=consumed_samples, phase=phase, is_built_on_rank=is_built_on_rank, **kwargs,
        )
    except DatasetConfigError as err:
        raise DatasetConfigError(f"{where}: {err}") from None
