"""Megatron's pretraining sampler: which samples each data-parallel rank reads, step by step.

Step k covers the `micro_batch_size * data_parallel_size` consecutive samples starting at
`consumed_samples + k * micro_batch_size * data_parallel_size`; rank r takes the r-th slice of
`micro_batch_size` of them. The position in the stream is therefore one number,
`consumed_samples`, independent of the data-parallel size: concatenating what the ranks read at
each step gives the same global order whatever the number of ranks, which is what makes resuming
on a different data-parallel size continue exactly where the run stopped.
"""

from __future__ import annotations

from collections.abc import Iterator

from .errors import DatasetConfigError


class MegatronPretrainingSampler:
    """Same signature and order as `megatron.training...MegatronPretrainingSampler`.

    Iterating yields, per step, the list of sample indices of this rank. With `drop_last=False`
    a final partial step yields this rank's part of what is left (possibly shorter or empty).
    """

    def __init__(
        self,
        total_samples: int,
        consumed_samples: int,
        micro_batch_size: int,
        data_parallel_rank: int,
        data_parallel_size: int,
        drop_last: bool = True,
    ) -> None:
        for name, value, low in (
            ("total_samples", total_samples, 1),
            ("consumed_samples", consumed_samples, 0),
            ("micro_batch_size", micro_batch_size, 1),
            ("data_parallel_size", data_parallel_size, 1),
            ("data_parallel_rank", data_parallel_rank, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise DatasetConfigError(f"{name} must be an integer >= {low}, got {value!r}")
        if data_parallel_rank >= data_parallel_size:
            raise DatasetConfigError(f"data_parallel_rank {data_parallel_rank} must be below data_parallel_size {data_parallel_size}")
        if consumed_samples > total_samples:
            raise DatasetConfigError(f"consumed_samples {consumed_samples} exceeds the {total_samples} samples of the dataset")
        self.total_samples = total_samples
        self.consumed_samples = consumed_samples
        self.micro_batch_size = micro_batch_size
        self.data_parallel_rank = data_parallel_rank
        self.data_parallel_size = data_parallel_size
        self.micro_batch_times_data_parallel_size = micro_batch_size * data_parallel_size
        self.drop_last = drop_last

    def __len__(self) -> int:
        """Steps left from `consumed_samples`."""
        left = self.total_samples - self.consumed_samples
        g = self.micro_batch_times_data_parallel_size
        return left // g if self.drop_last else -(-left // g)

    def __iter__(self) -> Iterator[list[int]]:
        g = self.micro_batch_times_data_parallel_size
        lo = self.data_parallel_rank * self.micro_batch_size
        for step_start in range(self.consumed_samples, self.total_samples, g):
            step_end = min(step_start + g, self.total_samples)
            if step_end - step_start < g and self.drop_last:
                return
            yield list(range(step_start + lo, min(step_start + lo + self.micro_batch_size, step_end)))
