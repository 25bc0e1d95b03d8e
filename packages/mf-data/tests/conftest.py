"""Fixtures for mf-data's tests: small datasets written on the fly, the Megatron reference cases,
and a sentencepiece model trained once per session on the demo corpus."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from mf_data import BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig, IndexedDatasetBuilder

SPLITS = ("train", "valid", "test")


def case_config(fixtures: Path, case: dict, cache: Path, **overrides) -> GPTDatasetConfig:
    """The GPTDatasetConfig a cases.json entry describes (see shared/fixtures/README.md)."""
    prefixes, weights = case["blend"]
    fields = dict(
        random_seed=case["seed"],
        sequence_length=case["seq"],
        blend=([str(fixtures / p) for p in prefixes], weights),
        split=case["split"],
        path_to_cache=str(cache),
        eod=1,
        pad=-1,
        create_attention_mask=False,
        reset_attention_mask=False,
        mid_level_dataset_surplus=0.005,
        add_extra_token_to_sequence=True,
        **case.get("flags", {}),
    )
    fields.update(overrides)
    return GPTDatasetConfig(**fields)


@pytest.fixture(scope="session")
def megatron_cases(megatron_fixtures: Path) -> dict[str, dict]:
    with open(megatron_fixtures / "cases.json") as f:
        return json.load(f)


def use_helpers(backend: str) -> pytest.MonkeyPatch:
    """A MonkeyPatch that makes mf_data.helpers run `backend` ("compiled" or "numpy"); skips the
    test when the compiled extension was not built (test_compiled_helpers_are_built fails then)."""
    from mf_data import helpers

    compiled = helpers._compiled
    if backend == "compiled" and compiled is None:
        pytest.skip("mf_data._chelpers was not built")
    patch = pytest.MonkeyPatch()
    patch.setattr(helpers, "_compiled", compiled if backend == "compiled" else None)
    return patch


@pytest.fixture(params=["compiled", "numpy"])
def helpers_backend(request) -> str:
    """Runs the test once with each implementation of the index loops."""
    patch = use_helpers(request.param)
    yield request.param
    patch.undo()


@pytest.fixture(scope="session", params=["compiled", "numpy"])
def built_cases(request, megatron_fixtures: Path, megatron_cases: dict, tmp_path_factory) -> dict[str, list]:
    """Every reference case built once per implementation of the index loops:
    name -> [train, valid, test]."""
    patch = use_helpers(request.param)
    out = {}
    try:
        for name, case in megatron_cases.items():
            cache = tmp_path_factory.mktemp(f"cache-{request.param}-{name}")
            config = case_config(megatron_fixtures, case, cache)
            out[name] = BlendedMegatronDatasetBuilder(GPTDataset, case["sizes"], lambda: True, config).build()
    finally:
        patch.undo()
    return out


@pytest.fixture
def write_dataset(tmp_path: Path) -> Callable[..., str]:
    """write_dataset(docs, dtype=np.uint16, name="d") -> prefix of a .bin/.idx holding `docs`."""

    def write(docs: Sequence[Sequence[int]], dtype=np.uint16, name: str = "d") -> str:
        prefix = str(tmp_path / name)
        builder = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
        for doc in docs:
            builder.add_document(np.asarray(doc), [len(doc)])
        builder.finalize(prefix + ".idx")
        return prefix

    return write


@pytest.fixture(scope="session")
def demo_corpus(tmp_path_factory) -> Path:
    from mf_data.demo_corpus import make_demo_corpus

    directory = tmp_path_factory.mktemp("demo")
    return Path(make_demo_corpus(str(directory))["path"])


@pytest.fixture(scope="session")
def spm_model(demo_corpus: Path, tmp_path_factory) -> Path:
    from mf_data.tokenizer import train_sentencepiece

    out = tmp_path_factory.mktemp("spm") / "spm.model"
    train_sentencepiece([str(demo_corpus)], str(out), vocab_size=400)
    return out


# A ChatML template with transformers' {% generation %} markers, so transformers can compute the
# reference assistant masks of the same template.
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endgeneration %}{% else %}{{ message['content'] + '<|im_end|>' + '\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _train_hf_tokenizer(texts: list[str], path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.save(str(path))


@pytest.fixture(scope="session")
def hf_tokenizer_dirs(tmp_path_factory) -> dict[str, Path]:
    """Two tiny Hugging Face tokenizer directories trained here with `tokenizers`: "chatml" has a
    ChatML chat template (eos <|im_end|>), "plain" has none (eos <|endoftext|>)."""
    from mf_data.demo_sft import demo_conversations

    texts = [m["content"] for c in list(demo_conversations())[:60] for m in c["messages"]]
    base = tmp_path_factory.mktemp("hf")
    dirs = {"chatml": base / "chatml", "plain": base / "plain"}
    for name, directory in dirs.items():
        directory.mkdir()
        _train_hf_tokenizer(texts, directory / "tokenizer.json")
        config = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": CHATML} if name == "chatml" \
            else {"eos_token": {"content": "<|endoftext|>", "special": True}, "bos_token": None}
        (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return dirs
