"""`monitor.train_state.local_norm`: the gradient norm of each parameter whose name matches a pattern.

The field is a regular expression searched (`re.search`) in every trained parameter's name (the
`parameters_and_names()` names `build_model` gives, which checkpoints hold too:
`layers.0.attention.wq.weight`, `tok_embeddings.weight`): `"wq"` picks every layer's query
projection, `"^layers\\.0\\."` layer 0, `"."` every parameter. Each step then records `grad_norm/<name>` in metrics.jsonl (and
`train/grad_norm/<name>` in TensorBoard): the L2 norm of that parameter's whole gradient before
clipping, what `grad_norm` is for all of them together.

Under FSDP, TP, HSDP and pipeline stages the norm is of the whole parameter, not of a rank's shard:
each rank adds the squares of the blocks it counts for the global norm (mf-parallel's
`GlobalNormClip`: every element once over the world) and one all-reduce of the vector of squares
gives every rank the one-process values. `device_norm` is the other view: this rank's own shards,
all parameters together.
"""

from __future__ import annotations

import re

from mf_trainer.errors import TrainerConfigError

KEY = "monitor.train_state.local_norm"
PREFIX = "grad_norm/"


def compile_pattern(pattern: str) -> re.Pattern:
    """The field's regular expression; TrainerConfigError (one keyed line) when it is not one."""
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise TrainerConfigError(f"{KEY}: {pattern!r} is not a regular expression ({exc})") from None


def select_parameters(pattern: str, trained: list[str], every: list[str] | None = None
                      ) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(positions, names) of the parameters `pattern` matches, in model order.

    `trained`: this rank's trained parameters' names in the optimizer's order; `every`: the whole
    model's trained names when the rank holds only part of it (a pipeline stage), else `trained`.
    A position is the index into `trained`, or -1 for a parameter another stage holds (its share
    of the sum is that stage's): every rank then all-reduces vectors of the same length.
    """
    if not pattern:
        return (), ()
    regex = compile_pattern(pattern)
    names = tuple(n for n in (every if every is not None else trained) if regex.search(n))
    if not names:
        sample = ", ".join((every or trained)[:3])
        raise TrainerConfigError(f"{KEY}: {pattern!r} matches no trained parameter (a regular expression searched "
                                 f"in names such as {sample})")
    index = {n: i for i, n in enumerate(trained)}
    return tuple(index.get(n, -1) for n in names), names


def norm_metrics(names: tuple[str, ...], values: tuple[float, ...]) -> dict[str, float]:
    """{"grad_norm/<name>": value} for a step's record."""
    return {PREFIX + n: v for n, v in zip(names, values)}
