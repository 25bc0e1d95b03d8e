"""`mf train` and its run directory, through the real entry point (`main(argv)`, as the console
script calls it): what a rerun does with what output_dir / save_path already hold (resume, refuse,
--overwrite), what the directory holds afterwards, the console's first lines and its accuracy, and
the refusals found before any step (unwritable outputs, token ids beyond the vocabulary).

One run (`trained`: 2 compiled steps) is reused by most tests; each test that changes a run
directory works on a copy of it."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from mf_cli.main import main

MODEL = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
         "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 32}


def write_config(path: Path, corpus: str, out: Path, **changes) -> str:
    cfg = {
        "output_dir": str(out),
        "context": {"mode": 1},
        "checkpoint": {"save_interleaved_steps": 2, "save_max": 2},
        "training": {"steps": 2, "local_batch_size": 2, "global_batch_size": 2, "seed": 4},
        "lr_scheduler": {"learning_rate": 1e-3},
        "train_dataset": {"dataloader": {
            "type": "BlendedMegatronDatasetDataLoader", "datasets_type": "GPTDataset", "sizes": [100, 0, 0],
            "column_names": ["input_ids", "labels", "loss_mask", "position_ids"],
            "config": {"seq_length": 16, "split": "1,0,0", "eod": 1, "pad": 0, "create_attention_mask": False,
                       "data_path": ["1", corpus]}}, "num_parallel_workers": 1},
        "model": MODEL,
        "monitor": {"peak_flops_per_device": 1e11},
    }
    for section, value in changes.items():
        cfg[section] = {**cfg[section], **value} if isinstance(value, dict) and section in cfg else value
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def train_steps(out: Path) -> list[int]:
    return [r["step"] for r in records(out) if "loss" in r]


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus):
    """A 2-step run, compiled (GRAPH_MODE), and what the console said."""
    import io
    import sys

    root = tmp_path_factory.mktemp("run")
    config = write_config(root / "train.yaml", corpus, root / "out", context={"mode": 0})
    stdout, old = io.StringIO(), sys.stdout
    sys.stdout = stdout
    try:
        assert main(["train", config]) == 0
    finally:
        sys.stdout = old
    return root, config, stdout.getvalue()


def copy_run(trained, tmp_path) -> tuple[Path, str]:
    """A private copy of the trained run (its config pointing at the copy)."""
    root, config, _ = trained
    shutil.copytree(root / "out", tmp_path / "out")
    raw = yaml.safe_load(Path(config).read_text())
    raw["output_dir"] = str(tmp_path / "out")
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(raw))
    return tmp_path / "out", str(path)


def test_the_console_says_where_everything_goes_and_counts_accurately(trained):
    root, _, console = trained
    lines = [x for x in console.splitlines() if x.startswith("[mf_trainer] ")]
    out = root / "out"
    assert lines[:6] == [f"[mf_trainer] output_dir: {out} (the resolved config.yaml; summary.json at the end)",
                         f"[mf_trainer] metrics: {out / 'metrics.jsonl'}",
                         f"[mf_trainer] tensorboard: {out / 'tensorboard'}",
                         f"[mf_trainer] log: {out / 'train.log'}",
                         f"[mf_trainer] checkpoints: {out / 'checkpoint'} (every 2 steps and at the end, 2 kept)",
                         "[mf_trainer] a new run"]
    # parameters: counted by hand from the model section (untied output, MHA: 2 heads of 16)
    h, f, v = 32, 64, 64
    total = 2 * v * h + (4 * h * h + 3 * h * f + 2 * h) + h
    assert f"[mf_trainer] parameters: {total:,} total, {total:,} trainable, {total:,} per rank" in lines
    assert "[mf_data] train_dataset: " in console
    # the first step's time does not include compiling the step, and neither does its ETA
    compiled = next(x for x in lines if x.startswith("[mf_trainer] compiled the training step in "))
    compile_seconds = float(re.search(r"in ([0-9.]+) s", compiled).group(1))
    first = next(r for r in records(out) if r.get("step") == 1 and "loss" in r)
    assert first["step_time_s"] < compile_seconds
    step1 = next(x for x in lines if " step 1/2 " in x)
    assert step1.endswith(f"ETA {round(first['step_time_s'])}s")     # 1 step left at step 1's own pace


def test_the_run_directory_explains_itself(trained, capsys):
    root, config, _ = trained
    out = root / "out"
    rows = records(out)
    assert all(isinstance(r["time"], float) for r in rows)
    assert [r["step"] for r in rows if "checkpoint" in r] == [2]
    assert rows[0]["step"] == 0 and "start" in rows[0]
    summary = json.loads((out / "summary.json").read_text())
    train = [r for r in rows if "loss" in r]
    assert summary["status"] == "finished" and summary["step"] == 2 and summary["skipped_steps"] == 0
    assert summary["final_loss"] == {"value": train[-1]["loss"], "step": 2}
    assert summary["best_loss"]["value"] == min(r["loss"] for r in train)
    assert summary["median_tokens_per_s"] == pytest.approx(float(np.median([r["tokens_per_s"] for r in train])))
    assert summary["last_checkpoint"] == {"step": 2, "path": str(out / "checkpoint" / "iteration_00000002")}
    assert summary["wall_time_s"] == pytest.approx(rows[-1]["time"] - rows[0]["start"], abs=1e-3)
    log = (out / "train.log").read_text().splitlines()
    assert re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ==== mf train session: step 0 of 2 \(new run\) ====$", log[0])
    assert all(re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ", line) for line in log if not line.startswith("  "))
    assert any(" [mf_trainer] step 2/2 (100.0%) | loss " in line for line in log)
    # config.yaml is the resolved config: mf train loads it, and it is the same run (finished)
    import mf_config

    assert mf_config.load_config(str(out / "config.yaml")) == mf_config.load_config(config)
    assert main(["train", str(out / "config.yaml")]) == 2
    assert "this run already finished at step 2" in error_line(capsys)


def test_rerunning_resumes_refuses_or_starts_over(trained, tmp_path, capsys):
    out, config = copy_run(trained, tmp_path)
    before = (out / "metrics.jsonl").read_text()
    # the same YAML: finished, nothing touched
    assert main(["train", config]) == 2
    assert error_line(capsys).startswith("mf train: error: training.steps: 2: this run already finished at step 2 ")
    assert (out / "metrics.jsonl").read_text() == before
    # more steps: the same run, resumed from its checkpoint; the history continues without repeats
    # (a failure policy such as the hang watchdog's timeout may change between sessions: said once
    # here, where no launcher watches)
    assert main(["train", config, "--set", "training.steps=3", "--set", "training.hang_timeout_s=30"]) == 0
    console = capsys.readouterr().out
    assert console.count("notice: training.hang_timeout_s: 30 s: the hang watchdog is mf launch's") == 1
    assert (f"[mf_trainer] resuming this run from its checkpoint at step 2 ({out / 'checkpoint' / 'iteration_00000002'})"
            in console)
    assert train_steps(out) == [1, 2, 3] and [r["step"] for r in records(out) if "start" in r] == [0, 2]
    assert json.loads((out / "summary.json").read_text())["sessions"] == 2
    # another config in the same place: refused, naming both ways out
    assert main(["train", config, "--set", "training.steps=4", "--set", "lr_scheduler.learning_rate=0.002"]) == 2
    line = error_line(capsys)
    assert line.startswith(f"mf train: error: checkpoint.save_path: {out / 'checkpoint'} holds checkpoint 3 of a "
                           "run_mode train run of another config (it differs in lr_scheduler.learning_rate (0.002 here, "
                           "0.001 there)): resume it with --set checkpoint.load_path=")
    assert "--overwrite to start over" in line and train_steps(out) == [1, 2, 3]
    # --overwrite: this run's own files go, anything else stays
    (out / "notes.txt").write_text("mine")
    (out / "checkpoint" / "README").write_text("mine too")
    (out / "logs").mkdir()
    (out / "logs" / "worker_0.log").write_text("a launch's log")
    assert main(["train", config, "--set", "lr_scheduler.learning_rate=0.002", "--overwrite"]) == 0
    console = capsys.readouterr().out
    assert "--overwrite: removing this run's earlier outputs (" in console
    assert train_steps(out) == [1, 2] and [r["step"] for r in records(out) if "start" in r] == [0]
    assert (out / "notes.txt").read_text() == "mine" and (out / "checkpoint" / "README").read_text() == "mine too"
    assert (out / "logs" / "worker_0.log").is_file()
    assert sorted(p.name for p in (out / "checkpoint").iterdir()) == ["README", "iteration_00000002",
                                                                      "latest_checkpointed_iteration.txt"]


def test_outputs_without_a_checkpoint_are_refused(trained, tmp_path, capsys):
    out, config = copy_run(trained, tmp_path)
    shutil.rmtree(out / "checkpoint")
    assert main(["train", config, "--set", "training.steps=3"]) == 2
    assert error_line(capsys) == (
        f"mf train: error: output_dir: {out} holds metrics.jsonl, summary.json and tensorboard of an earlier run "
        "but no checkpoint to resume from (a new run would mix its history into them): --overwrite to start over "
        "(removes only this run's own outputs there), or choose another output_dir")
    # mf launch says so before msrun starts (it would create <output_dir>/logs first)
    assert main(["launch", "-n", "2", config, "--set", "training.steps=3", "--set", "training.global_batch_size=4"]) == 2
    assert "output_dir: " in error_line(capsys) and not (out / "logs").exists()
    # the dry run plans it, and writes nothing
    listing = sorted(str(p) for p in out.rglob("*"))
    assert main(["train", config, "--dry-run", "--overwrite"]) == 0
    plan = capsys.readouterr().out
    assert "mf train: dry run: start: --overwrite: removing this run's earlier outputs (" in plan
    assert sorted(str(p) for p in out.rglob("*")) == listing


def test_the_dry_run_says_it_would_resume(trained, capsys):
    root, config, _ = trained
    assert main(["train", config, "--dry-run", "--set", "training.steps=5"]) == 0
    assert (f"mf train: dry run: start: resuming this run from its checkpoint at step 2 "
            f"({root / 'out' / 'checkpoint' / 'iteration_00000002'})") in capsys.readouterr().out


def test_mf_eval_of_a_training_yaml_evaluates_its_checkpoint(trained, capsys):
    root, config, _ = trained
    valid = ["--set", "train_dataset.dataloader.sizes=[100, 4, 0]", "--set", "train_dataset.dataloader.config.split='90,10,0'"]
    assert main(["eval", config, "--json", *valid]) == 0
    captured = capsys.readouterr()
    got = json.loads(captured.out.strip().splitlines()[-1])
    assert got["weights"] == str(root / "out" / "checkpoint")
    assert f"weights: {root / 'out' / 'checkpoint'} (the run's trained weights: checkpoint.save_path, iteration 2)" \
        in captured.err


def test_unwritable_outputs_are_refused_before_any_work(tmp_path, corpus, capsys):
    (tmp_path / "afile").write_text("x")
    cases = [({"output_dir": str(tmp_path / "afile")}, f"output_dir: {tmp_path / 'afile'} is a file, not a directory"),
             ({"checkpoint": {"save_path": str(tmp_path / "afile" / "ckpt")}},
              f"checkpoint.save_path: {tmp_path / 'afile' / 'ckpt'} cannot be created: {tmp_path / 'afile'} is a file")]
    if os.geteuid() == 0:    # root writes anywhere but on a read-only mount
        if not os.access("/proc/sys", os.W_OK):
            cases.append(({"checkpoint": {"save_path": "/proc/sys/mf-ckpt"}},
                          "checkpoint.save_path: /proc/sys/mf-ckpt cannot be created: /proc/sys is not writable"))
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        cases.append(({"output_dir": str(locked / "out")},
                      f"output_dir: {locked / 'out'} cannot be created: {locked} is not writable"))
    for i, (change, message) in enumerate(cases):
        config = write_config(tmp_path / f"c{i}.yaml", corpus, tmp_path / f"out{i}", **change)
        for argv, name in ((["train", config], "train"), (["train", config, "--dry-run"], "train"),
                           (["config", "validate", config], "config")):
            assert main(argv) == 2
            assert error_line(capsys) == f"mf {name}: error: {message}"
        assert not (tmp_path / f"out{i}").exists()
    # a config written for another machine: --no-files skips the checks that look at this one's
    assert main(["config", "validate", str(tmp_path / "c0.yaml"), "--no-files"]) == 0
    assert "output_dir and checkpoint.save_path can be written (needs this machine's files" in capsys.readouterr().err


def _dataset(prefix: Path, top: int) -> str:
    import mf_data

    builder = mf_data.IndexedDatasetBuilder(mf_data.get_bin_path(str(prefix)), dtype=np.uint16)
    for start in range(30):
        builder.add_item(((np.arange(40) * 3 + start) % top + 1).astype(np.uint16))
        builder.end_document()
    builder.finalize(mf_data.get_idx_path(str(prefix)))
    Path(mf_data.get_stats_path(str(prefix))).unlink()     # as Megatron writes it: no recorded range
    return str(prefix)


def test_token_ids_beyond_the_vocabulary_are_found_before_any_step(tmp_path, corpus, capsys):
    good, bad = _dataset(tmp_path / "good", 60), _dataset(tmp_path / "bad", 70)
    blend = {"train_dataset": {"dataloader": {
        "type": "BlendedMegatronDatasetDataLoader", "datasets_type": "GPTDataset", "sizes": [100, 0, 0],
        "column_names": ["input_ids", "labels", "loss_mask", "position_ids"],
        "config": {"seq_length": 16, "split": "1,0,0", "eod": 1, "pad": 0, "create_attention_mask": False,
                   "data_path": ["0.5", good, "0.5", bad]}}, "num_parallel_workers": 1}}
    config = write_config(tmp_path / "c.yaml", corpus, tmp_path / "out", **blend)
    message = (f"train_dataset.dataloader.config.data_path: {bad} holds token ids 1..70, outside model.vocab_size 64 "
               "(ids 0..63): it was tokenised for another vocabulary; re-tokenise it or raise model.vocab_size above 70")
    assert main(["config", "validate", config]) == 2
    assert error_line(capsys) == f"mf config: error: {message}"
    assert not Path(bad + ".stats.json").exists()            # validate writes nothing, not even the cache
    assert main(["train", config]) == 2
    assert error_line(capsys) == f"mf train: error: {message}"
    assert not (tmp_path / "out").exists()
    assert Path(bad + ".stats.json").exists()                # a real run caches the range for the next one


def test_a_run_that_skipped_its_steps_exits_1_and_says_why(tmp_path, corpus, capsys):
    config = write_config(tmp_path / "fp16.yaml", corpus, tmp_path / "out", training={"steps": 4,
                          "max_consecutive_nonfinite": 100}, model={"params_dtype": "float16", "compute_dtype": "float16"})
    assert main(["train", config]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("mf train: training failed: 3 of 4 steps (75%) were skipped as non-finite, more than "
                          "training.max_skipped_fraction 0.1; fp16 parameters on CPU are the common cause "
                          "(model.params_dtype: float16")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["skipped_steps"] == 3 and "fp16" in summary["reason"]
    assert summary["final_loss"]["value"] == "nan"
