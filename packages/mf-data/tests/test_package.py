"""The package imports in its own venv and reports the version its metadata declares."""

from importlib.metadata import version

import mf_data


def test_version_matches_metadata():
    assert mf_data.__version__ == version("mf-data")
