"""Shared helpers for the mf-models tests: tiny model sections, PyNative by default."""

from __future__ import annotations

import os
from pathlib import Path

import mindspore as ms
import pytest

# Synchronous PyNative: on busy shared cores the asynchronous op pipeline is many times slower for
# these tiny models (see generation.py).
ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU", pynative_synchronize=True)


def _hf_fixture_names() -> list[str]:
    # Collection-time view of shared/fixtures/hf (the root conftest's `hf_fixtures` gives the same
    # directory to the tests): every `<name>_ref.npz` with a `<name>/` checkpoint is one case.
    env = os.environ.get("MF_SHARED_FIXTURES")
    candidates = [Path(env)] if env else []
    here = Path(__file__).resolve()
    candidates += [a / "shared" / "fixtures" for a in here.parents] + [Path("/work/shared/fixtures")]
    for root in candidates:
        hf = root / "hf"
        if hf.is_dir():
            return sorted(p.name[: -len("_ref.npz")] for p in hf.glob("*_ref.npz") if (hf / p.name[: -len("_ref.npz")]).is_dir())
    return []


def pytest_generate_tests(metafunc):
    if "hf_name" in metafunc.fixturenames:
        names = _hf_fixture_names()
        metafunc.parametrize("hf_name", names or ["<no shared/fixtures/hf found>"], scope="module")


@pytest.fixture
def graph_mode():
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        yield
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
