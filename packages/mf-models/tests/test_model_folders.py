"""Each model folder declares itself (`<model_type>/spec.py`), and what it declares holds together:
the names, the args class and the classes its refs name live in the folder, the tiny preset
validates, and mf-ckpt's rule file converts exactly the parameters the inventory lists (which
test_inventory.py checks against the built model). A new folder is covered here by being there."""

from __future__ import annotations

from importlib import resources

import numpy as np
import pytest

import mf_ckpt
import mf_models

MODELS = sorted(mf_models.available_models())


def test_every_folder_with_a_spec_is_registered_under_its_name():
    folders = sorted(e.name for e in resources.files("mf_models").iterdir()
                     if e.is_dir() and e.joinpath("spec.py").is_file())
    assert folders == MODELS


@pytest.mark.parametrize("model_type", MODELS)
def test_the_spec_names_its_own_folder(model_type):
    spec = mf_models.resolve_spec(model_type)
    folder = f"mf_models.{model_type}."
    assert spec.args_cls.__module__ == folder + "args"
    assert spec.model_cls.__module__.startswith(folder) and spec.model_cls.__name__ == spec.architecture
    assert spec.parallelize.__module__.startswith(folder)
    assert mf_models.resolve_spec(architectures=[spec.architecture]) is spec


@pytest.mark.parametrize("model_type", MODELS)
def test_the_tiny_preset_validates_and_converts_both_ways(model_type):
    section = mf_models.tiny_model_section(model_type)
    spec, args = mf_models.build_args(section)
    assert spec.model_type == model_type and mf_models.spec_for_args(args) is spec
    assert model_type in mf_ckpt.supported_model_types(), f"no mf-ckpt rule file hf/models/{model_type}.py"
    rng = np.random.default_rng(0)
    state = {e.name: rng.standard_normal(e.shape).astype(np.float32) for e in mf_models.parameter_inventory(args)}
    hf = mf_ckpt.mf_to_hf(state, section)           # raises on a parameter the rules do not name
    back = mf_ckpt.hf_to_mf(hf, section)
    assert back.keys() == state.keys()
    for name, arr in state.items():
        np.testing.assert_array_equal(back[name], arr, err_msg=name)


def test_a_model_without_an_inventory_says_so(monkeypatch):
    from mf_models import registry

    llama = mf_models.resolve_spec("llama")
    other = type("OtherArgs", (llama.args_cls,), {})
    monkeypatch.setitem(registry._BY_TYPE, "other_llama",   # registered for this test only
                        mf_models.ModelSpec("other_llama", "OtherLlamaForCausalLM", other, llama.model_ref))
    args = other(**{k: v for k, v in mf_models.tiny_model_section("llama").items() if k != "model_type"})
    with pytest.raises(mf_models.ModelConfigError, match=r"^model.model_type: the parameter inventory of "
                                                          r"other_llama is not tabulated yet; covered: deepseek_v3, "):
        mf_models.parameter_inventory(args)
