"""The installed `mf` command runs as a user would run it."""

import subprocess
import sys


def test_mf_version_reports_the_cli_package_version():
    from importlib.metadata import version

    out = subprocess.run([sys.executable, "-m", "mf_cli.main", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"mf {version('mf-cli')}"
