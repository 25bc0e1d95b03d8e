"""The callback registry: decorator, YAML specs, errors that name what is available."""

from __future__ import annotations

import sys
import types

import pytest

from mf_trainer.callbacks import CALLBACKS, Callback, build_callbacks, register_callback
from mf_trainer.errors import TrainerConfigError


@register_callback
class RecordingCallback(Callback):
    def __init__(self, tag: str, every: int = 1):
        self.tag, self.every = tag, every


def test_registered_callback_is_built_from_a_yaml_item():
    (cb,) = build_callbacks([{"type": "RecordingCallback", "tag": "x", "every": 3}])
    assert isinstance(cb, RecordingCallback) and (cb.tag, cb.every) == ("x", 3)


def test_register_under_another_name_and_refuse_a_clash():
    @register_callback("Renamed")
    class Other(Callback):
        pass

    assert CALLBACKS["Renamed"] is Other
    with pytest.raises(ValueError, match="already registered as 'Renamed'"):
        register_callback("Renamed")(type("Third", (Callback,), {}))
    with pytest.raises(TypeError, match="not a Callback subclass"):
        register_callback(int)


def test_unknown_type_lists_registered_callbacks():
    with pytest.raises(TrainerConfigError) as err:
        build_callbacks([{"type": "StopAtStep", "step": 2}, {"type": "Nope"}])
    msg = str(err.value)
    assert msg.startswith("callbacks[1].type: unknown callback 'Nope'; registered: ")
    assert "RecordingCallback" in msg and "StopAtStep" in msg


def test_bad_kwargs_name_the_callback_and_its_parameters():
    with pytest.raises(TrainerConfigError, match=r"callbacks\[0\]: bad arguments for callback RecordingCallback .*it accepts: tag, every"):
        build_callbacks([{"type": "RecordingCallback", "tag": "x", "evry": 2}])
    with pytest.raises(TrainerConfigError, match=r"callbacks\[0\]: callback StopAtStep rejected its arguments: step must be"):
        build_callbacks([{"type": "StopAtStep", "step": 0}])


def test_module_colon_class_imports_a_user_callback():
    module = types.ModuleType("user_hooks_for_test")

    class UserHook(Callback):
        def __init__(self, n=1):
            self.n = n

    module.UserHook = UserHook
    sys.modules["user_hooks_for_test"] = module
    try:
        (cb,) = build_callbacks([{"type": "user_hooks_for_test:UserHook", "n": 4}])
        assert isinstance(cb, UserHook) and cb.n == 4
        with pytest.raises(TrainerConfigError, match="is not a mf_trainer.Callback subclass"):
            build_callbacks([{"type": "user_hooks_for_test:Missing"}])
    finally:
        del sys.modules["user_hooks_for_test"]
    with pytest.raises(TrainerConfigError, match="cannot import 'no_such_module_xyz'"):
        build_callbacks([{"type": "no_such_module_xyz:X"}])


def test_built_in_callbacks_cannot_be_listed_again():
    import mf_trainer  # noqa: F401  (registers the built-ins)

    with pytest.raises(TrainerConfigError, match="MetricsLogger is built in and always on"):
        build_callbacks([{"type": "MetricsLogger"}])


def test_items_with_extra_attribute_like_mf_config_sections():
    item = types.SimpleNamespace(type="StopAtStep", extra={"step": 5})
    (cb,) = build_callbacks([item])
    assert cb.step == 5
