"""`mf config validate|show`, through the real entry point."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from mf_cli.main import main
from mf_config import load_config

SKELETON = Path(__file__).resolve().parents[3] / "examples" / "skeleton.yaml"
MINIMAL = ("model:\n  model_type: qwen3\n  num_hidden_layers: 4\n  num_attention_heads: 4\n"
           "train_dataset:\n  dataloader:\n    type: BlendedMegatronDatasetDataLoader\n"
           "    column_names: [input_ids, labels, loss_mask]\ntraining:\n  steps: 10\n")


def _write(tmp_path, text: str) -> str:
    path = tmp_path / "train.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_validate_ok_prints_ok_and_warns_on_stderr(capsys):
    # The skeleton sets every section of the reference. Its MoE monitor names layers 0-2, which its
    # DeepSeek-V3 keeps dense (first_k_dense_replace: 3): as MindFormers' monitor, one notice line per
    # layer without experts (the others would be monitored), and the config validates.
    assert main(["config", "validate", str(SKELETON), "--world", "8", "--device", "Ascend"]) == 0
    out, err = capsys.readouterr()
    assert out == f"{SKELETON}: OK\n"
    assert err == "".join(
        f"mf config: notice: monitor.moe_monitor.target_layers: layer {i} has no routed experts (the MoE layers are "
        "3-11): not monitored\n" for i in range(3)) + (
        # the skeleton's data prefix is a placeholder: a warning, not an error
        "mf config: warning: train_dataset.dataloader.config.data_path: /path/megatron_data_text_document.bin"
        " and /path/megatron_data_text_document.idx not found\n")


def test_validate_bad_value_exits_2_with_one_line(tmp_path, capsys):
    path = _write(tmp_path, MINIMAL.replace("steps: 10", "steps: 10\n  global_batch_size: 0"))
    assert main(["config", "validate", path]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "mf config: error: training.global_batch_size: must be positive, got 0\n"


def test_validate_with_overrides(tmp_path, capsys):
    path = _write(tmp_path, MINIMAL)
    assert main(["config", "validate", path, "--set", "training.steps=20", "--set", "parallelism.tensor_parallel=2"]) == 0
    assert main(["config", "validate", path, "--set", "training.stpes=20"]) == 2
    err = capsys.readouterr().err
    assert err.endswith("mf config: error: training.stpes: unknown key; did you mean 'steps'?\n")


def test_malformed_override_and_missing_file_are_one_line_errors(tmp_path, capsys):
    assert main(["config", "validate", _write(tmp_path, MINIMAL), "--set", "training.steps"]) == 2
    assert capsys.readouterr().err == "mf config: error: --set training.steps: expected KEY=VALUE, e.g. training.steps=20\n"
    missing = str(tmp_path / "nope.yaml")
    assert main(["config", "show", missing]) == 2
    assert capsys.readouterr().err == f"mf config: error: {missing}: no such file\n"


def test_show_prints_the_resolved_yaml_that_loads_back_equal(tmp_path, capsys):
    assert main(["config", "show", str(SKELETON), "--set", "training.steps=20"]) == 0
    out = capsys.readouterr().out
    shown = yaml.safe_load(out)
    assert shown["training"]["steps"] == 20
    assert shown["monitor"]["log_interval"] == 1  # defaults filled in
    again = load_config(_write(tmp_path, out))
    assert again == load_config(SKELETON, overrides=["training.steps=20"])


def test_show_resolves_the_default_checkpoint_path(tmp_path, capsys):
    assert main(["config", "show", _write(tmp_path, MINIMAL), "--set", "output_dir=/runs/x"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["checkpoint"]["save_path"] == "/runs/x/checkpoint"


def test_broken_yaml_reports_the_line(tmp_path, capsys):
    path = _write(tmp_path, "training:\n  steps: [1,\nmodel: {}\n")
    assert main(["config", "validate", path]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mf config: error: {path}: invalid YAML at line 4, column 1: ")
    assert err.endswith("(while parsing a flow sequence at line 2, column 10)\n") and err.count("\n") == 1


def test_real_process_exit_codes_and_no_traceback(tmp_path):
    bad = _write(tmp_path, MINIMAL + "swap:\n  enable: true\n  default_prefetch: 4\n  layer_swap:\n    - layers: ['0']\n")
    run = subprocess.run([sys.executable, "-m", "mf_cli.main", "config", "validate", bad],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr == ("mf config: error: swap.default_prefetch: must be in [1, model.num_hidden_layers - 1]"
                          " = [1, 3], got 4\n")
    ok = subprocess.run([sys.executable, "-m", "mf_cli.main", "config", "validate", _write(tmp_path, MINIMAL),
                         "--world", "1", "--device", "CPU"], capture_output=True, text=True, timeout=120)
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, f"{tmp_path / 'train.yaml'}: OK\n", "")
    # without --world / --device, the checks that need them are named as not checked
    ok = subprocess.run([sys.executable, "-m", "mf_cli.main", "config", "validate", _write(tmp_path, MINIMAL)],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and ok.stdout.startswith(f"{tmp_path / 'train.yaml'}: OK (")
    skipped = ok.stderr.splitlines()
    assert skipped and all(line.startswith("mf config: not checked: ") for line in skipped)
    assert any("parallel degrees fit the world size (needs the world size: --world N)" in line for line in skipped)
