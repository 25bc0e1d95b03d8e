"""Learning-rate schedulers: pure Python functions of the optimizer step, fed to the compiled step.

The names and keyword arguments follow MindFormers' schedulers (`mindformers.core.lr`), so a YAML
written for MindFormers keeps working; the formulas follow MindFormers' documented equations
(the README lists each one). Where MindFormers' code departs from its own documentation we follow
the documentation, and say so in the README:
  * `CosineWithWarmUpLR`: with `decay_steps` < total_steps the cosine reaches `lr_end` exactly at
    `decay_steps` (MindFormers keeps the cosine over total_steps and then jumps to lr_end).
  * `PolynomialWithWarmUpLR`: `decay_steps` is the length of the decay after warm-up, as
    documented (MindFormers' code compares it with the absolute step).
  * Every "after the schedule" value is the scheduler's final LR (`lr_end`, `lr_end2`), never 0.

`s` is the number of optimizer updates already applied (0 for the first update), so with warm-up
the first update uses `warmup_lr_init`, as in MindFormers and Hugging Face.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from mf_trainer.errors import TrainerConfigError

_WARMUP_KEYS = {"warmup_steps": None, "warmup_ratio": None, "warmup_lr_init": 0.0, "total_steps": None}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class LRScheduler(ABC):
    """Base class: subclasses declare `KEYS` (accepted pass-through keys and defaults) and `_lr`."""

    KEYS: dict[str, Any] = {}
    INT_KEYS: frozenset[str] = frozenset({"warmup_steps", "total_steps", "decay_steps", "keep_steps",
                                          "final_steps", "decay_start_steps"})
    RATIO_KEYS: frozenset[str] = frozenset({"warmup_ratio", "decay_ratio", "decay_start_ratio"})
    ALIASES: dict[str, str] = {}

    def __init__(self, learning_rate: float, **kwargs):
        name = type(self).__name__
        if not _is_number(learning_rate) or learning_rate < 0:
            raise TrainerConfigError(f"lr_scheduler.learning_rate: must be a number >= 0, got {learning_rate!r}")
        for alias, target in self.ALIASES.items():
            if alias in kwargs:
                if target in kwargs:
                    raise TrainerConfigError(f"lr_scheduler: give {target} or its alias {alias}, not both")
                kwargs[target] = kwargs.pop(alias)
        unknown = sorted(set(kwargs) - set(self.KEYS))
        if unknown:
            accepted = ", ".join(sorted(self.KEYS) + sorted(self.ALIASES))
            raise TrainerConfigError(
                f"lr_scheduler.{unknown[0]}: {name} takes no such key; accepted keys: {accepted}")
        values = {**self.KEYS, **kwargs}
        for key, value in values.items():
            if value is None:
                continue
            if key in self.INT_KEYS and (not _is_int(value) or value < 0):
                raise TrainerConfigError(f"lr_scheduler.{key}: must be an integer >= 0, got {value!r}")
            if key in self.RATIO_KEYS and (not _is_number(value) or not 0.0 <= value <= 1.0):
                raise TrainerConfigError(f"lr_scheduler.{key}: must be a number in [0, 1], got {value!r}")
            if key not in self.INT_KEYS and key not in self.RATIO_KEYS and not _is_number(value):
                raise TrainerConfigError(f"lr_scheduler.{key}: must be a number, got {value!r}")
        self.learning_rate = float(learning_rate)
        self.params = values
        if values.get("total_steps") is None:
            raise TrainerConfigError(f"lr_scheduler.total_steps: {name} needs it (the Trainer fills in training.steps)")
        self.total_steps = int(values["total_steps"])
        self.warmup_steps = self._steps("warmup_steps", "warmup_ratio", default=0)
        self.warmup_lr_init = float(values["warmup_lr_init"])
        self._setup()

    # ---- helpers shared by the schedulers ----------------------------------------------------
    def _steps(self, steps_key: str, ratio_key: str | None, default: int | None) -> int | None:
        """A step count given either directly or as a ratio of total_steps (not both)."""
        steps = self.params.get(steps_key)
        ratio = self.params.get(ratio_key) if ratio_key else None
        if steps is not None and ratio is not None:
            raise TrainerConfigError(f"lr_scheduler: give {steps_key} or {ratio_key}, not both")
        if ratio is not None:
            return int(self.total_steps * float(ratio))
        return default if steps is None else int(steps)

    def _warmup(self, s: int) -> float:
        return self.warmup_lr_init + (self.learning_rate - self.warmup_lr_init) * s / self.warmup_steps

    def _setup(self) -> None:  # noqa: B027 - an optional hook: most schedulers derive nothing
        """Resolve derived quantities and check cross-key rules."""

    @abstractmethod
    def _lr(self, s: int) -> float:
        """The LR after `s` applied updates, warm-up included."""

    # ---- public API ----------------------------------------------------------------------------
    def __call__(self, s: int) -> float:
        """The LR for the update that follows `s` applied updates."""
        if s < self.warmup_steps:
            return self._warmup(s)
        return float(self._lr(s))

    def describe(self) -> dict:
        """The resolved schedule (written to the run log and the checkpoint)."""
        return {"type": type(self).__name__, "learning_rate": self.learning_rate,
                **{k: v for k, v in self.params.items() if v is not None}, "warmup_steps": self.warmup_steps}


class ConstantWarmUpLR(LRScheduler):
    KEYS = dict(_WARMUP_KEYS)

    def _lr(self, s):
        return self.learning_rate


class LinearWithWarmUpLR(LRScheduler):
    KEYS = {**_WARMUP_KEYS, "lr_end": 0.0}
    ALIASES = {"min_lr": "lr_end"}

    def _lr(self, s):
        lr_end = float(self.params["lr_end"])
        span = max(1, self.total_steps - self.warmup_steps)
        pct = max(0.0, (self.total_steps - s) / span)
        return lr_end + (self.learning_rate - lr_end) * pct


class CosineWithWarmUpLR(LRScheduler):
    KEYS = {**_WARMUP_KEYS, "num_cycles": 0.5, "lr_end": 0.0, "decay_steps": None, "decay_ratio": None}
    ALIASES = {"min_lr": "lr_end"}

    def _setup(self):
        self.decay_end = max(1, self._steps("decay_steps", "decay_ratio", default=self.total_steps))

    def _lr(self, s):
        lr_end = float(self.params["lr_end"])
        if s >= self.decay_end:
            return lr_end
        progress = (s - self.warmup_steps) / max(1, self.decay_end - self.warmup_steps)
        pct = max(0.0, 0.5 * (1.0 + math.cos(math.pi * float(self.params["num_cycles"]) * 2.0 * progress)))
        return lr_end + (self.learning_rate - lr_end) * pct


class CosineWithRestartsAndWarmUpLR(LRScheduler):
    KEYS = {**_WARMUP_KEYS, "num_cycles": 1.0, "lr_end": 0.0, "decay_steps": None}
    ALIASES = {"min_lr": "lr_end"}

    def _setup(self):
        self.decay_end = max(1, self._steps("decay_steps", None, default=self.total_steps))

    def _lr(self, s):
        lr_end = float(self.params["lr_end"])
        progress = (s - self.warmup_steps) / max(1, self.decay_end - self.warmup_steps)
        if progress >= 1.0:
            return lr_end
        phase = (float(self.params["num_cycles"]) * progress) % 1.0
        pct = max(0.0, 0.5 * (1.0 + math.cos(math.pi * phase)))
        return lr_end + (self.learning_rate - lr_end) * pct


class PolynomialWithWarmUpLR(LRScheduler):
    KEYS = {**_WARMUP_KEYS, "lr_end": 1e-7, "power": 1.0, "decay_steps": None}
    ALIASES = {"min_lr": "lr_end"}

    def _setup(self):
        if not self.learning_rate > float(self.params["lr_end"]):
            raise TrainerConfigError(
                f"lr_scheduler.lr_end: must be below learning_rate {self.learning_rate}, got {self.params['lr_end']}")
        self.decay_steps = max(1, self._steps("decay_steps", None, default=self.total_steps - self.warmup_steps))

    def _lr(self, s):
        lr_end = float(self.params["lr_end"])
        done = s - self.warmup_steps
        if done >= self.decay_steps:
            return lr_end
        remaining = 1.0 - done / self.decay_steps
        return lr_end + (self.learning_rate - lr_end) * remaining ** float(self.params["power"])


class WarmUpStableDecayLR(LRScheduler):
    KEYS = {**_WARMUP_KEYS, "lr_end": 1e-7, "decay_start_steps": None, "decay_start_ratio": None}
    ALIASES = {"min_lr": "lr_end"}

    def _setup(self):
        if not self.learning_rate > float(self.params["lr_end"]):
            raise TrainerConfigError(
                f"lr_scheduler.lr_end: must be below learning_rate {self.learning_rate}, got {self.params['lr_end']}")
        # No stable phase unless asked: decay starts right after warm-up.
        self.decay_start = self._steps("decay_start_steps", "decay_start_ratio", default=self.warmup_steps)
        if not self.warmup_steps <= self.decay_start <= self.total_steps:
            raise TrainerConfigError(
                f"lr_scheduler.decay_start_steps: must lie in [warmup_steps={self.warmup_steps}, "
                f"total_steps={self.total_steps}], got {self.decay_start}")

    def _lr(self, s):
        lr_end = float(self.params["lr_end"])
        if s < self.decay_start:
            return self.learning_rate
        if s >= self.total_steps:
            return lr_end
        frac = (s - self.decay_start) / max(1, self.total_steps - self.decay_start)
        return self.learning_rate - (self.learning_rate - lr_end) * frac


class ConstantWithCoolDownLR(LRScheduler):
    KEYS = {**_WARMUP_KEYS, "keep_steps": 0, "decay_steps": None, "decay_ratio": None, "num_cycles": 0.5,
            "lr_end1": 0.0, "final_steps": 0, "lr_end2": None}

    def _setup(self):
        self.keep_steps = int(self.params["keep_steps"])
        self.final_steps = int(self.params["final_steps"])
        rest = self.total_steps - self.warmup_steps - self.keep_steps - self.final_steps
        self.decay_steps = self._steps("decay_steps", "decay_ratio", default=rest)
        if self.decay_steps <= 0:
            raise TrainerConfigError(
                f"lr_scheduler.decay_steps: ConstantWithCoolDownLR has no room to decay (total_steps "
                f"{self.total_steps} - warmup {self.warmup_steps} - keep_steps {self.keep_steps} - "
                f"final_steps {self.final_steps} = {rest}); set decay_steps or decay_ratio")
        lr_end2 = self.params["lr_end2"]
        self.lr_end1 = float(self.params["lr_end1"])
        self.lr_end2 = self.lr_end1 if lr_end2 is None else float(lr_end2)

    def _lr(self, s):
        decay_start = self.warmup_steps + self.keep_steps
        if s < decay_start:
            return self.learning_rate
        done = s - decay_start
        if done < self.decay_steps:
            progress = done / self.decay_steps
            pct = max(0.0, 0.5 * (1.0 + math.cos(math.pi * float(self.params["num_cycles"]) * 2.0 * progress)))
            return self.lr_end1 + (self.learning_rate - self.lr_end1) * pct
        if done < self.decay_steps + self.final_steps:
            return self.lr_end1
        return self.lr_end2


SCHEDULERS: dict[str, type[LRScheduler]] = {
    cls.__name__: cls
    for cls in (ConstantWarmUpLR, LinearWithWarmUpLR, CosineWithWarmUpLR, CosineWithRestartsAndWarmUpLR,
                PolynomialWithWarmUpLR, WarmUpStableDecayLR, ConstantWithCoolDownLR)
}


def build_scheduler(type_name: str | None, learning_rate: float, extra: Mapping[str, Any] | None,
                    total_steps: int) -> LRScheduler:
    """The scheduler named by `lr_scheduler.type` (None = constant LR, ConstantWarmUpLR without warm-up).

    `extra` holds the section's pass-through keys; `total_steps` (training.steps) is the default
    of the scheduler's own `total_steps` key.
    """
    kwargs = dict(extra or {})
    kwargs.setdefault("total_steps", int(total_steps))
    name = type_name or "ConstantWarmUpLR"
    if name not in SCHEDULERS:
        raise TrainerConfigError(
            f"lr_scheduler.type: unknown scheduler {name!r}; available: {', '.join(sorted(SCHEDULERS))}")
    return SCHEDULERS[name](learning_rate, **kwargs)
