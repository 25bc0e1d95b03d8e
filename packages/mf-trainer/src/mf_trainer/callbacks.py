"""Callbacks: hooks into the training loop, and the registry the YAML's `callbacks:` list names.

    callbacks:
      - type: StopAfterLoss          # a registered name ...
        threshold: 2.5               # ... every other key goes to its constructor
      - type: my_pkg.hooks:MyHook    # or "module:Class", imported on demand

Hooks (all optional; the Trainer calls them in list order, built-ins first):
    on_train_begin(trainer)
    on_step_begin(trainer, step)           step = 1-based index of the step about to run
    on_step_end(trainer, metrics)          metrics = the dict written to metrics.jsonl
    on_evaluate(trainer, metrics)          after an evaluation (eval_dataset): step, eval_loss, eval_ppl, ...
    on_save(trainer, step, path)           after a checkpoint of `step` is committed at `path`
    on_train_end(trainer)
A hook may set `trainer.should_stop = True` to end training after the current step (a final
checkpoint is still written).

The logging and checkpoint callbacks are built in and always on (configured by the `monitor` and
`checkpoint` sections); naming them in `callbacks:` is an error rather than a second copy.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterable, Mapping
from typing import Any

from mf_trainer.errors import TrainerConfigError


class Callback:
    """Base class; override the hooks you need."""

    def on_train_begin(self, trainer) -> None:
        pass

    def on_step_begin(self, trainer, step: int) -> None:
        pass

    def on_step_end(self, trainer, metrics: dict) -> None:
        pass

    def on_evaluate(self, trainer, metrics: dict) -> None:
        pass

    def on_save(self, trainer, step: int, path: str) -> None:
        pass

    def on_train_end(self, trainer) -> None:
        pass


CALLBACKS: dict[str, type[Callback]] = {}
# Built-ins that are always on (monitor.py's MetricsLogger): listing them in the YAML is refused
# with this reason. Named here, not registered by monitor.py: resolving a name then needs no import
# of the monitor (MindSpore).
BUILT_IN_ALWAYS_ON: dict[str, str] = {
    "MetricsLogger": "configure it with monitor.log_interval and monitor.tensorboard",
}


def register_callback(cls_or_name: type[Callback] | str | None = None):
    """Class decorator adding a Callback subclass to the registry, under its class name or `name`.

        @register_callback
        class MyHook(Callback): ...

        @register_callback("Nicer")
        class MyOtherHook(Callback): ...
    """

    def add(cls: type[Callback], name: str | None) -> type[Callback]:
        if not (isinstance(cls, type) and issubclass(cls, Callback)):
            raise TypeError(f"register_callback: {cls!r} is not a Callback subclass")
        key = name or cls.__name__
        existing = CALLBACKS.get(key)
        if existing is not None and existing is not cls:
            raise ValueError(f"register_callback: a different callback is already registered as {key!r}")
        CALLBACKS[key] = cls
        return cls

    if isinstance(cls_or_name, type):
        return add(cls_or_name, None)
    return lambda cls: add(cls, cls_or_name)


def _resolve(type_name: str, path: str) -> type[Callback]:
    if type_name in BUILT_IN_ALWAYS_ON:
        raise TrainerConfigError(f"{path}.type: {type_name} is built in and always on; {BUILT_IN_ALWAYS_ON[type_name]}")
    if type_name in CALLBACKS:
        return CALLBACKS[type_name]
    if ":" in type_name:
        module_name, _, attr = type_name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise TrainerConfigError(f"{path}.type: cannot import {module_name!r} ({exc})") from None
        cls = getattr(module, attr, None)
        if not (isinstance(cls, type) and issubclass(cls, Callback)):
            raise TrainerConfigError(f"{path}.type: {type_name!r} is not a mf_trainer.Callback subclass")
        return cls
    available = ", ".join(sorted(CALLBACKS)) or "none"
    raise TrainerConfigError(
        f"{path}.type: unknown callback {type_name!r}; registered: {available} (or give 'module:Class')")


def build_callback(type_name: str, kwargs: Mapping[str, Any], path: str = "callbacks[0]") -> Callback:
    """Instantiate one callback, checking `kwargs` against its constructor first."""
    cls = _resolve(type_name, path)
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as exc:
        params = [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]
        accepted = ", ".join(params) or "none"
        raise TrainerConfigError(f"{path}: bad arguments for callback {type_name} ({exc}); it accepts: {accepted}") from None
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise TrainerConfigError(f"{path}: callback {type_name} rejected its arguments: {exc}") from None


def build_callbacks(specs: Iterable[Any]) -> list[Callback]:
    """Callbacks from the YAML list: each item has `type` and pass-through keys (`extra`)."""
    out = []
    for i, spec in enumerate(specs or ()):
        if isinstance(spec, Mapping):
            spec = dict(spec)
            type_name, kwargs = spec.pop("type", None), spec
        else:
            type_name, kwargs = getattr(spec, "type", None), dict(getattr(spec, "extra", None) or {})
        if not type_name:
            raise TrainerConfigError(f"callbacks[{i}].type: required")
        out.append(build_callback(type_name, kwargs, path=f"callbacks[{i}]"))
    return out


class CallbackList:
    """Fans each hook out to every callback, in order."""

    def __init__(self, callbacks: Iterable[Callback]):
        self.callbacks = list(callbacks)

    def __iter__(self):
        return iter(self.callbacks)

    def on_train_begin(self, trainer):
        for cb in self.callbacks:
            cb.on_train_begin(trainer)

    def on_step_begin(self, trainer, step):
        for cb in self.callbacks:
            cb.on_step_begin(trainer, step)

    def on_step_end(self, trainer, metrics):
        for cb in self.callbacks:
            cb.on_step_end(trainer, metrics)

    def on_evaluate(self, trainer, metrics):
        for cb in self.callbacks:
            cb.on_evaluate(trainer, metrics)

    def on_save(self, trainer, step, path):
        for cb in self.callbacks:
            cb.on_save(trainer, step, path)

    def on_train_end(self, trainer):
        for cb in self.callbacks:
            cb.on_train_end(trainer)


@register_callback
class StopAfterLoss(Callback):
    """Stop training once the loss reaches `threshold` (checked every step)."""

    def __init__(self, threshold: float):
        if not isinstance(threshold, (int, float)) or isinstance(threshold, bool):
            raise ValueError(f"threshold must be a number, got {threshold!r}")
        self.threshold = float(threshold)

    def on_step_end(self, trainer, metrics):
        loss = metrics.get("loss")
        if loss is not None and loss <= self.threshold:
            trainer.should_stop = True


@register_callback
class StopAtStep(Callback):
    """Stop after `step` steps: a planned interruption (the run can be resumed from its checkpoint)."""

    def __init__(self, step: int):
        if not isinstance(step, int) or isinstance(step, bool) or step < 1:
            raise ValueError(f"step must be a positive integer, got {step!r}")
        self.step = step

    def on_step_end(self, trainer, metrics):
        if metrics["step"] >= self.step:
            trainer.should_stop = True
