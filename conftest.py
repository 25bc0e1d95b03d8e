"""Shared pytest fixtures for every test directory of the monorepo.

Reference files written by other people's code (Megatron-Core, Hugging Face transformers) live in
the steering repository's `shared/fixtures/`, beside this checkout; they are not copied into the
repo. `MF_SHARED_FIXTURES` points elsewhere if needed. This file imports nothing beyond pytest and
the standard library, so it works in every package's isolated venv.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def _find_shared_fixtures() -> Path | None:
    env = os.environ.get("MF_SHARED_FIXTURES")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent
    for ancestor in (here, *here.parents):
        candidate = ancestor / "shared" / "fixtures"
        if candidate.is_dir():
            return candidate
    fallback = Path("/work/shared/fixtures")
    return fallback if fallback.is_dir() else None


SHARED_FIXTURES = _find_shared_fixtures()


@pytest.fixture(scope="session")
def shared_fixtures() -> Path:
    """`shared/fixtures/`: reference files from Megatron-Core and HF transformers."""
    if SHARED_FIXTURES is None:
        pytest.fail("shared/fixtures not found beside the checkout; set MF_SHARED_FIXTURES")
    return SHARED_FIXTURES


@pytest.fixture(scope="session")
def megatron_fixtures(shared_fixtures: Path) -> Path:
    return shared_fixtures / "megatron"


@pytest.fixture(scope="session")
def hf_fixtures(shared_fixtures: Path) -> Path:
    return shared_fixtures / "hf"
