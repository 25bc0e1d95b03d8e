"""The full-size presets of examples/presets/ pass `mf train --dry-run` at their cluster's world
size (they are not for this machine). Every tiny YAML of examples/ is run as its README command
says, as written, by tests-integration/dist/test_readme_commands.py (one demo run feeding the
rest: its checkpoint is the base of the LoRA and full fine-tunes, the weights of eval / predict).
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name, world", [("llama3_8b", 16), ("qwen3_8b", 16), ("deepseek_v3", 256),
                                         ("glm4_5_air", 64), ("qwen2_57b_a14b", 32)])
def test_full_size_presets_pass_the_dry_run(tmp_path, name, world, capsys, monkeypatch):
    from mf_cli.main import main

    monkeypatch.chdir(tmp_path)          # their outputs are relative: the dry run must write none
    path = ROOT / "examples" / "presets" / f"{name}.yaml"
    assert main(["train", str(path), "--dry-run", "--world", str(world)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"layout: world={world} " in out and "start: a new run" in out and "nothing was written" in out
    assert list(tmp_path.iterdir()) == []
