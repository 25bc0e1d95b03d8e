"""Every caller asks mf-trainer's preflight the same question: `mf config validate`, `mf train`
(and its --dry-run), `mf launch` before msrun starts. They refuse the same configs with the same
key paths, list every problem, and the config check costs no MindSpore import."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from mf_cli.main import main


def _cfg(tmp_path, **sections) -> dict:
    cfg = {"output_dir": str(tmp_path / "out"),
           "training": {"steps": 2, "local_batch_size": 1, "global_batch_size": 4},
           "train_dataset": {"dataloader": {
               "type": "BlendedMegatronDatasetDataLoader", "datasets_type": "GPTDataset", "sizes": [100, 0, 0],
               "column_names": ["input_ids", "labels", "loss_mask"],
               "config": {"seq_length": 16, "split": "1,0,0", "data_path": ["1", str(tmp_path / "none")]}}},
           "model": {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 32}}
    for name, value in sections.items():
        cfg[name] = {**cfg[name], **value} if isinstance(value, dict) and isinstance(cfg.get(name), dict) else value
    return cfg


def _write(tmp_path, cfg, name="train.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _keys(err: str, command: str) -> list[str]:
    prefix = f"mf {command}: error: "
    lines = [x for x in err.splitlines() if x.startswith(prefix)]
    return [x[len(prefix):].split(": ")[0] for x in lines]


REFUSED_BY_TRAIN = [
    {"parallelism": {"pipeline_parallel": 2}},
    {"parallelism": {"tensor_parallel": 2}},
    {"parallelism": {"data_parallel_shard_strategy": "optim"}},
    {"model": {"hidden_sizee": 64}},
    {"model": {"vocab_size": 63}, "parallelism": {"tensor_parallel": 2}},
    {"inference": {"prompts": ["hi"]}},
    {"tokenizer": {"path": "tok", "type": "hf"}},
    {"swap": {"enable": True}},
    {"run_mode": "finetune"},
    {"lora": {"target_modules": "wq"}},
    {"profiler": {"start_step": 2}},
    {"monitor": {"train_state": {"local_norm": "wq("}}},
    {"lr_scheduler": {"type": "Cosine"}},
]


@pytest.mark.parametrize("sections", REFUSED_BY_TRAIN, ids=lambda s: ",".join(f"{k}" for k in s))
def test_validate_refuses_what_train_refuses_with_the_same_keys(tmp_path, capsys, sections):
    path = _write(tmp_path, _cfg(tmp_path, **sections))
    assert main(["train", path]) == 2
    train_keys = _keys(capsys.readouterr().err, "train")
    assert main(["config", "validate", path, "--world", "1", "--device", "CPU"]) == 2
    validate_keys = _keys(capsys.readouterr().err, "config")
    assert train_keys and train_keys == validate_keys
    assert not (tmp_path / "out").exists()


def test_loss_mask_missing_is_refused_by_both(tmp_path, capsys):
    cfg = _cfg(tmp_path)
    cfg["train_dataset"]["dataloader"]["column_names"] = ["input_ids", "labels"]
    path = _write(tmp_path, cfg)
    assert main(["config", "validate", path]) == 2
    assert capsys.readouterr().err == ("mf config: error: train_dataset.dataloader.column_names: the Trainer needs "
                                       "'loss_mask'\n")
    assert main(["train", path]) == 2
    assert capsys.readouterr().err == ("mf train: error: train_dataset.dataloader.column_names: the Trainer needs "
                                       "'loss_mask'\n")


def test_three_independent_problems_are_three_lines(tmp_path, capsys):
    path = _write(tmp_path, _cfg(tmp_path, model={"hidden_sizee": 64}, parallelism={"data_parallel_shard_strategy": "optim"},
                                 inference={"prompts": ["hi"]}))
    for argv, command in ((["config", "validate", path], "config"), (["train", path], "train"),
                          (["launch", "-n", "2", path], "launch")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 3, err
        assert sorted(_keys(err, command)) == ["model.hidden_sizee", "parallelism.data_parallel_shard_strategy",
                                               "tokenizer.path"]


def test_validate_without_world_lists_what_it_skipped(tmp_path, capsys):
    path = _write(tmp_path, _cfg(tmp_path, parallelism={"tensor_parallel": 2}))
    assert main(["config", "validate", path]) == 0           # tp 2 is fine for some world
    out, err = capsys.readouterr()
    assert out.startswith(f"{path}: OK (") and "parallel degrees fit the world size (needs the world size" in err
    assert main(["config", "validate", path, "--world", "2"]) == 0
    assert main(["config", "validate", path, "--world", "3"]) == 2
    assert "does not divide the world size 3" in capsys.readouterr().err
    assert main(["config", "validate", path, "--world", "0"]) == 2


def test_validate_answers_without_importing_mindspore(tmp_path):
    path = _write(tmp_path, _cfg(tmp_path, model={"hidden_sizee": 64}))
    # The real entry point, then a look at what it imported.
    code = ("import sys\nfrom mf_cli.main import main\nrc = main(sys.argv[1:])\n"
            "print('MINDSPORE' if any(m == 'mindspore' or m.startswith('mindspore.') for m in sys.modules) else 'CLEAN')\n"
            "sys.exit(rc)\n")
    run = subprocess.run([sys.executable, "-c", code, "config", "validate", path], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "GLOG_v": "3"})
    assert run.returncode == 2, run.stderr
    assert run.stdout.strip() == "CLEAN"
    assert run.stderr.startswith("mf config: error: model.hidden_sizee: unknown key for llama (LlamaForCausalLM); "
                                 "did you mean 'hidden_size'?")


def test_dry_run_writes_nothing(tmp_path, capsys):
    path = _write(tmp_path, _cfg(tmp_path))
    assert main(["train", path, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "layout: world=1 " in out and "batch: 4 micro-batch(es) per step" in out and "64 tokens per step" in out
    assert f"metrics: {tmp_path / 'out' / 'metrics.jsonl'}" in out and "checkpoints: " in out
    assert "memory per rank (world=1 " in out and "total" in out      # mf_trainer.memory_plan's table
    assert main(["train", path, "--dry-run", "--world", "4", "--build-model"]) == 0
    out = capsys.readouterr().out
    assert "layout: world=4 pp=1 dp_replicate=1 dp_shard=4" in out and "batch: 1 micro-batch(es)" in out
    line = next(x for x in out.splitlines() if "parameters: " in x)
    assert "trainable" in line and "per rank" in line
    assert not (tmp_path / "out").exists()
    # a layout the world cannot hold is refused like `mf launch -n 3` would refuse it
    assert main(["train", path, "--dry-run", "--world", "3", "--set", "parallelism.tensor_parallel=2"]) == 2
    assert "does not divide the world size 3" in capsys.readouterr().err
    assert main(["train", path, "--world", "2"]) == 2        # --world only plans
    assert not (tmp_path / "out").exists()


# The reference's parallelism example (seed 000, "示例：FSDP + TP + PP + MoE EP 组合"), verbatim.
SEED_PARALLELISM_EXAMPLE = """\
parallelism:
  data_parallel_shard: -1
  reshard_after_forward_policy: "default"
  cpu_offload: False
  disable_gradient_division: True
  tensor_parallel: 2
  pipeline_parallel: 2
  pipeline_parallel_overlap_p2p: True       # PP overlap 系列
  pipeline_parallel_overlap_b_f: True
  context_parallel: 1
  expert_parallel: 8                        # MoE：EP >= npu_nums_per_device
  npu_nums_per_device: 8
  moe_token_dispatcher_type: "alltoall_deredundancy"
"""
SKELETON = Path(__file__).resolve().parents[3] / "examples" / "skeleton.yaml"


@pytest.mark.parametrize("device", ["CPU", "Ascend"])
def test_the_references_parallelism_example_plans_at_its_own_world(tmp_path, capsys, device):
    """TP2 x PP2 x EP8 over FSDP with alltoall_deredundancy and both overlap flags, laid over the
    skeleton (its DeepSeek-V3), at world 32: deredundancy beside tp and in MoE pipeline stages is
    proven by the dist case moe_seed_layout, overlap_b_f runs under 1f1b. (The skeleton's
    moe_monitor targets are another item of issue 25, left out here.)"""
    cfg = yaml.safe_load(SKELETON.read_text(encoding="utf-8"))
    cfg.update(yaml.safe_load(SEED_PARALLELISM_EXAMPLE))
    cfg.pop("monitor")
    cfg["output_dir"] = str(tmp_path / "out")
    cfg["checkpoint"]["save_path"] = str(tmp_path / "out" / "ckpt")
    path = _write(tmp_path, cfg)
    assert main(["train", path, "--dry-run", "--world", "32", "--set", f"context.device_target={device}"]) == 0, \
        capsys.readouterr().err
    out = capsys.readouterr().out
    assert "layout: world=32 pp=2 dp_replicate=1 dp_shard=8 cp=1 tp=2 ep=8 (FSDP, TP+SP, PP, EP)" in out
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("overrides, key", [
    (["--set", "model.hidden_sizee=64"], "model.hidden_sizee"),
    (["--set", "parallelism.data_parallel_shard_strategy=optim"], "parallelism.data_parallel_shard_strategy"),
    (["--set", "parallelism.tensor_parallel=4"], "parallelism"),     # 4 ranks of tensor parallelism, world 2
])
def test_launch_refuses_before_msrun_starts(tmp_path, overrides, key):
    path = _write(tmp_path, _cfg(tmp_path))
    start = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "mf_cli.main", "launch", "-n", "2", path, *overrides],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "GLOG_v": "3"})
    seconds = time.monotonic() - start
    assert run.returncode == 2, run.stdout + run.stderr
    assert _keys(run.stderr, "launch") == [key] and run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
    # msrun was never started: the launcher creates <output_dir>/logs (msrun.log, worker logs) first
    assert not (tmp_path / "out").exists() and "mf launch: 2 ranks" not in run.stdout
    print(f"mf launch refused in {seconds:.2f} s")
