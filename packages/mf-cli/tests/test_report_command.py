"""`mf report` on real runs made here by `mf train` (a tiny llama, 6 steps, PyNative, eval every 3
steps, a checkpoint every 2): `full` uninterrupted (and reported on while it is held still at
step 3), `resumed` the same config stopped at step 2, resumed and stopped at 4, resumed to the end,
and `lr` the same config at twice the learning rate. The expected numbers are read back from the
metrics.jsonl files with json here, not through mf_cli.report."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from mf_cli.main import main

HERE = Path(__file__).resolve().parent
STEPS = 6
RTOL = 1e-5


def _env() -> dict:
    # report_hooks (this directory) must be importable by the training process.
    return {**os.environ, "GLOG_v": "3", "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}


def _mf(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "mf_cli.main", *args], capture_output=True, text=True, cwd=cwd,
                          env=_env(), timeout=600)


def _config(root: Path, corpus: str, run: str, tag: str, **changes) -> str:
    loader = {"type": "BlendedMegatronDatasetDataLoader", "datasets_type": "GPTDataset", "sizes": [100, 0, 0],
              "column_names": ["input_ids", "labels", "loss_mask", "position_ids"],
              "config": {"seq_length": 16, "split": "1,0,0", "eod": 1, "pad": 0, "create_attention_mask": False,
                         "data_path": ["1", corpus]}}
    cfg = {
        "output_dir": str(root / run),
        "context": {"mode": 1},
        "checkpoint": {"save_interleaved_steps": 2, "save_max": 2},
        "training": {"steps": STEPS, "local_batch_size": 2, "global_batch_size": 2, "seed": 5},
        "lr_scheduler": {"type": "WarmUpStableDecayLR", "learning_rate": 3e-3, "warmup_steps": 2,
                         "decay_start_steps": 4, "lr_end": 1e-4},
        "train_dataset": {"dataloader": loader, "num_parallel_workers": 1},
        "eval_dataset": {"dataloader": {**loader, "sizes": [6, 0, 0]}, "eval_interval": 3, "eval_iters": 2},
        "model": {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
                  "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 32},
        "monitor": {"peak_flops_per_device": 1e11},
    }
    for section, value in changes.items():
        cfg[section] = {**cfg[section], **value} if isinstance(value, dict) else value
    path = root / f"{run}_{tag}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _train(config: str) -> None:
    done = _mf("train", config)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _train_records(run_dir: Path) -> dict[int, dict]:
    return {r["step"]: r for r in _records(run_dir / "metrics.jsonl") if "loss" in r}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus):
    root = tmp_path_factory.mktemp("runs")
    # `full`, held at the end of step 3 (its metrics line written) while it is reported on.
    paused, release = root / "paused", root / "release"
    hold = [{"type": "report_hooks:PauseAtStep", "step": 3, "paused": str(paused), "release": str(release)}]
    with open(root / "full.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mf_cli.main", "train",
                                 _config(root, corpus, "full", "run", callbacks=hold)],
                                stdout=log, stderr=subprocess.STDOUT, env=_env())
        try:
            deadline = time.monotonic() + 300
            while not paused.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the full run did not reach step 3:\n{(root / 'full.log').read_text()[-3000:]}")
                time.sleep(0.1)
            running = _mf("report", str(root / "full"), "--out", str(root / "running.png"))
            snapshot = (root / "full" / "metrics.jsonl").read_text()
        finally:
            release.touch()
            proc.wait(timeout=600)
    assert proc.returncode == 0, (root / "full.log").read_text()[-3000:]
    # `resumed`: stopped at 2, resumed and stopped at 4, resumed to the end.
    load = {"load_path": str(root / "resumed" / "checkpoint")}
    _train(_config(root, corpus, "resumed", "a", callbacks=[{"type": "StopAtStep", "step": 2}]))
    _train(_config(root, corpus, "resumed", "b", callbacks=[{"type": "StopAtStep", "step": 4}], checkpoint=load))
    _train(_config(root, corpus, "resumed", "c", checkpoint=load))
    _train(_config(root, corpus, "lr", "run", lr_scheduler={"learning_rate": 6e-3}))
    return {"root": root, "running": running, "snapshot": snapshot}


def test_the_runs_are_what_the_comparisons_assume(runs):
    root = runs["root"]
    full, resumed, lr = (_train_records(root / name) for name in ("full", "resumed", "lr"))
    assert list(full) == list(resumed) == list(lr) == list(range(1, STEPS + 1))
    assert [full[s]["loss"] for s in full] == [resumed[s]["loss"] for s in resumed]  # bit for bit
    # The warm-up's first LR is 0: both start with two identical steps, then part.
    assert [full[s]["lr"] for s in (1, 2)] == [0.0, 1.5e-3] and [lr[s]["lr"] for s in (1, 2)] == [0.0, 3e-3]
    assert full[2]["loss"] == lr[2]["loss"] and full[3]["loss"] != lr[3]["loss"]


def test_report_on_a_run_still_going(runs):
    running = runs["running"]
    assert running.returncode == 0, running.stderr
    head = running.stdout.splitlines()[0]
    assert head.startswith(f"full ({runs['root'] / 'full'}): steps 1-3 (3 recorded, 0 skipped); ")
    assert f"last checkpoint: step 2, {runs['root'] / 'full' / 'checkpoint' / 'iteration_00000002'}" in running.stdout
    assert (runs["root"] / "running.png").stat().st_size > 10_000


def test_summary_numbers_come_from_the_metrics(runs, tmp_path):
    root = runs["root"]
    out = _mf("report", str(root / "full"), str(root / "lr"), "--no-plot")
    assert out.returncode == 0, out.stderr
    rows = _records(root / "full" / "metrics.jsonl")
    train = [r for r in rows if "loss" in r]
    evals = [r for r in rows if "eval_loss" in r]
    best = min(train, key=lambda r: r["loss"])
    block = out.stdout.split("\nlr (")[0]
    assert f"steps 1-{STEPS} ({STEPS} recorded, 0 skipped)" in block
    assert f"median {float(np.median([r['tokens_per_s'] for r in train])):.4g} tokens/s" in block
    assert f"loss: best {best['loss']:.4f} at step {best['step']}, final {train[-1]['loss']:.4f} at step {STEPS}" in block
    assert [r["step"] for r in evals] == [3, 6]
    assert f"eval loss: best {min(r['eval_loss'] for r in evals):.4f}" in block
    # checkpoints from the checkpoint records: 2 was committed, then rotated away (save_max 2)
    assert [r["step"] for r in rows if "checkpoint" in r] == [2, 4, 6]
    assert f"last checkpoint: step {STEPS}, {root / 'full' / 'checkpoint' / 'iteration_00000006'} " \
           "(on disk: step(s) 4, 6; rotated away: 2)" in block
    # wall time: from the session's start record to its last record (mf-trainer's `time` fields)
    starts = [r for r in rows if "start" in r]
    assert len(starts) == 1 and starts[0]["step"] == 0
    wall = rows[-1]["time"] - starts[0]["start"]
    assert _wall_time(block) == pytest.approx(wall, abs=0.01 if wall < 60 else 1.0)
    assert not (tmp_path / "report.png").exists()


def _wall_time(text: str) -> float:
    """The seconds of `wall time 12.34 s` / `wall time 1m05s` / `wall time 1h02m05s` in a summary."""
    import re

    match = re.search(r"wall time (?:(\d+)h)?(?:(\d+)m)?(\d+(?:\.\d+)?)(?: s|s)", text)
    assert match, text
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    return 3600 * hours + 60 * minutes + seconds


def test_a_resumed_run_adds_up_its_sessions(runs):
    root = runs["root"]
    rows = _records(root / "resumed" / "metrics.jsonl")
    starts = [i for i, r in enumerate(rows) if "start" in r]
    assert [rows[i]["step"] for i in starts] == [0, 2, 4]            # a new run, then two resumes
    ends = [*starts[1:], len(rows)]
    wall = sum(rows[end - 1]["time"] - rows[start]["start"] for start, end in zip(starts, ends))
    out = _mf("report", str(root / "resumed"), "--no-plot")
    assert out.returncode == 0, out.stderr
    head = out.stdout.splitlines()[0]
    assert " over 3 sessions (" in head, head
    # the gaps between the sessions (their start-up before the start record excepted) are not counted
    assert _wall_time(head) == pytest.approx(wall, abs=0.01 if wall < 60 else 1.0)
    assert "note:" not in out.stdout                                 # one clean history: nothing to explain


def test_compare_a_resumed_run_with_the_uninterrupted_one_exits_0(runs):
    root = runs["root"]
    out = _mf("report", str(root / "full"), str(root / "resumed"), "--compare", "--no-plot")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"compare resumed against full (rtol {RTOL:g}): {STEPS} common step(s)" in out.stdout
    assert "loss      max relative difference 0 (identical at every common step)" in out.stdout
    assert "grad_norm max relative difference 0 (identical at every common step)" in out.stdout
    assert out.stderr == ""


def test_compare_a_run_with_another_lr_exits_1_naming_the_worst_step(runs):
    root = runs["root"]
    out = _mf("report", str(root / "full"), str(root / "lr"), "--compare", "--no-plot")
    assert out.returncode == 1, out.stdout + out.stderr
    full, lr = _train_records(root / "full"), _train_records(root / "lr")
    worst = {}
    for key in ("loss", "grad_norm"):
        a = np.array([full[s][key] for s in full], np.float64)
        b = np.array([lr[s][key] for s in lr], np.float64)
        rel = np.abs(b - a) / np.maximum(np.abs(a), 1e-12)
        assert (rel[:2] == 0).all() and (rel[2:] > RTOL).all()   # step 1's LR is 0 (warm-up): no update
        worst[key] = (float(rel.max()), int(np.argmax(rel)) + 1)
        assert f"max relative difference {rel.max():.3g} at step {worst[key][1]}" in out.stdout
        assert f"above rtol at {STEPS - 2} step(s): 3-{STEPS}" in out.stdout
    key = max(worst, key=lambda k: worst[k][0])
    assert out.stderr == (f"mf report: compare: lr differs from full: {key} relative difference "
                          f"{worst[key][0]:.3g} at step {worst[key][1]} > rtol {RTOL:g}\n")
    # a tolerance above the largest difference passes
    looser = _mf("report", str(root / "full"), str(root / "lr"), "--compare", "--no-plot",
                 "--rtol", f"{2 * worst[key][0]:g}")
    assert looser.returncode == 0, looser.stdout + looser.stderr


def test_steps_missing_from_one_run_are_reported(runs, tmp_path):
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "metrics.jsonl").write_text(runs["snapshot"])   # full, as it was at step 3
    full = str(runs["root"] / "full")
    out = _mf("report", full, str(partial), "--compare", "--no-plot")
    assert out.returncode == 1
    assert "compare partial against full (rtol 1e-05): 3 common step(s)" in out.stdout
    assert f"step(s) only in full: 4-{STEPS}" in out.stdout
    assert "recorded different steps (add --common-only" in out.stderr
    out = _mf("report", full, str(partial), "--compare", "--no-plot", "--common-only")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"step(s) only in full: 4-{STEPS} (not compared: --common-only)" in out.stdout


_NO_MINDSPORE = """
import importlib.abc, sys

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("mindspore", "mf_trainer", "mf_models", "mf_parallel"):
            raise ImportError("mf report must not import " + name)

sys.meta_path.insert(0, Refuse())
from mf_cli.main import main
code = main(sys.argv[1:])
assert "mindspore" not in sys.modules
sys.exit(code)
"""


def _by_gid(ax) -> dict[str, tuple[list, list]]:
    return {line.get_gid(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()
            if line.get_gid()}


def test_the_png_has_every_panel_with_every_runs_data_and_no_mindspore(runs, tmp_path):
    """The PNG written by the command, in a process where importing MindSpore (or an mf package that
    needs it) fails, and the Figure the same code builds, inspected before saving."""
    from matplotlib.image import imread

    from mf_cli.report import build_figure, compare_runs, read_run
    from mf_cli.report.figure import DPI, PANELS, ROW_IN, WIDTH_IN

    root, names = runs["root"], ("full", "resumed", "lr")
    png = tmp_path / "report.png"
    argv = ["report", *(str(root / n) for n in names), "--name", "full", "--name", "resumed", "--name", "lr",
            "--compare", "--out", str(png)]
    out = subprocess.run([sys.executable, "-c", _NO_MINDSPORE, *argv], capture_output=True, text=True, env=_env(),
                         timeout=600)
    assert out.returncode == 1, out.stdout + out.stderr   # lr differs: the PNG is written all the same
    assert f"mf report: wrote {png} (1200x1320 px, 3 run(s))" in out.stdout
    image = imread(png)
    assert image.shape[:2] == (round(4 * ROW_IN * DPI), round(WIDTH_IN * DPI))
    assert image[..., :3].std() > 0.05   # not a blank canvas

    loaded = [read_run(root / n) for n in names]
    fig = build_figure(loaded, [compare_runs(loaded[0], other, RTOL) for other in loaded[1:]])
    axes = {ax.get_label(): ax for ax in fig.axes}
    assert set(axes) == {key for key, _ in PANELS} | {"compare"}
    for key, _ in PANELS:
        lines = _by_gid(axes[key])
        for name in names:
            records = _train_records(root / name)
            scale = 100.0 if key == "mfu" else 1.0
            assert lines[name] == (list(records), [scale * records[s][key] for s in records]), (key, name)
    loss = _by_gid(axes["loss"])
    full_evals = [r for r in _records(root / "full" / "metrics.jsonl") if "eval_loss" in r]
    assert loss["full eval"] == ([3, 6], [r["eval_loss"] for r in full_evals])
    assert loss["resumed eval"][0] == [2, 3, 4, 6]   # each attempt also evaluated where it stopped
    for name in names:   # save_max 2: checkpoint 2 was rotated away (a hollow triangle)
        assert loss[f"{name} checkpoints"][0] == [4, 6] and loss[f"{name} rotated checkpoints"][0] == [2]
    assert [t.get_text() for t in axes["loss"].get_legend().get_texts()] == [
        "full", "resumed", "lr", "full eval", "resumed eval", "lr eval", "checkpoint"]
    compare = _by_gid(axes["compare"])
    assert compare["resumed loss"][1] == [0.0] * STEPS == compare["resumed grad_norm"][1]
    assert compare["lr loss"][1][:2] == [0.0, 0.0] and min(compare["lr loss"][1][2:]) > RTOL


def _lines(run_dir: Path, steps) -> list[str]:
    return [line for line in (run_dir / "metrics.jsonl").read_text().splitlines() if json.loads(line)["step"] in steps]


def test_duplicated_steps_take_the_latest_record_and_say_so(runs, tmp_path):
    """A metrics.jsonl as a rerun that does not cut the old lines writes it: `full` up to step 4, then
    all of `lr` from step 1 again, then a line being written."""
    from mf_cli.report import compare_runs, read_run

    root = runs["root"]
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    text = "\n".join(_lines(root / "full", range(1, 5)) + _lines(root / "lr", range(1, STEPS + 1))) + "\n"
    (mixed / "metrics.jsonl").write_text(text + '{"step": 7, "loss": 3.9, "lr"')
    run = read_run(mixed)
    lr = read_run(root / "lr")
    assert run.train == lr.train and run.evals == lr.evals
    assert run.duplicate_steps == [1, 2, 3, 4] and run.restarts == [(4, 1)] and run.torn_last_line
    assert compare_runs(lr, run, rtol=0).passed()
    out = _mf("report", str(mixed), "--no-plot")
    assert out.returncode == 0, out.stderr
    assert "note: duplicate records of step(s) 1-4 in metrics.jsonl" in out.stdout
    assert "the latest record of each is used" in out.stdout
    assert "note: the last line is incomplete" in out.stdout

    # The other way round: a longer history rewritten by a shorter one. Steps 4-6 of the first
    # attempt are superseded, not merged into the second.
    (mixed / "metrics.jsonl").write_text("\n".join(_lines(root / "lr", range(1, STEPS + 1)) +
                                                   _lines(root / "full", range(1, 4))) + "\n")
    run = read_run(mixed)
    assert run.train == {s: r for s, r in read_run(root / "full").train.items() if s <= 3}
    assert list(run.evals) == [3] and run.superseded_steps == [4, 5, 6]


def test_skipped_steps_are_counted_marked_and_compared(runs, tmp_path):
    """A non-finite step as MetricsLogger writes it (strings for NaN/inf, skipped true)."""
    from mf_cli.report import build_figure, read_run

    root = runs["root"]
    skipped = tmp_path / "skipped"
    skipped.mkdir()
    rows = _records(root / "full" / "metrics.jsonl")
    for row in rows:
        if row["step"] == 4 and "loss" in row:
            row.update(loss="nan", grad_norm="inf", skipped=True, skipped_steps=1)
    (skipped / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = _mf("report", str(root / "full"), str(skipped), "--compare", "--no-plot")
    assert out.returncode == 1
    assert f"steps 1-{STEPS} ({STEPS} recorded, 1 skipped: 4)" in out.stdout
    assert "loss      max relative difference inf at step 4" in out.stdout
    run = read_run(skipped)
    assert math.isnan(run.train[4]["loss"]) and run.skipped_steps == [4]
    fig = build_figure([run])
    for ax in fig.axes:   # a red dotted vertical at step 4 on every panel
        assert _by_gid(ax)["skipped skipped"][0] == [4, 4], ax.get_label()


@pytest.fixture
def not_runs(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "metrics.jsonl").write_text("")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": \n{"step": 3}\n')
    (tmp_path / "nostep").mkdir()
    (tmp_path / "nostep" / "metrics.jsonl").write_text('{"loss": 2.0}\n')
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0, "grad_norm": 1.0}\n')
    return tmp_path


@pytest.mark.parametrize("argv, message", [
    (["missing"], "mf report: error: missing: no such directory"),
    (["empty"], "mf report: error: empty: no metrics.jsonl (not an mf run directory"),
    (["blank"], "mf report: error: blank/metrics.jsonl: holds no training or evaluation records"),
    (["bad"], "mf report: error: bad/metrics.jsonl:2: not a JSON object (Expecting value)"),
    (["nostep"], "mf report: error: nostep/metrics.jsonl:1: a metrics record needs a non-negative integer 'step'"),
    (["ok", "--rtol", "1e-3"], "mf report: error: --rtol applies to --compare; add --compare"),
    (["ok", "--common-only"], "mf report: error: --common-only applies to --compare"),
    (["ok", "--compare"], "mf report: error: --compare needs at least two RUN_DIRs"),
    (["ok", "blank", "--compare", "--rtol", "-1"], "mf report: error: --rtol: must be a finite number >= 0, got -1.0"),
    (["ok", "--name", "a", "--name", "b"], "mf report: error: --name: given 2 time(s) for 1 RUN_DIR(s)"),
    (["ok", "ok/"], "mf report: error: ok/: given twice"),
    (["ok", "--out", "nowhere/r.png"], "mf report: error: --out nowhere/r.png: the directory"),
    (["ok", "--out", "empty"], "mf report: error: --out empty: is a directory"),
    (["ok", "--out", "r.png", "--no-plot"], "mf report: error: --out and --no-plot: choose one"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(not_runs, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(not_runs)
    assert main(["report", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(message) and captured.err.count("\n") == 1, captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    assert not list(not_runs.rglob("*.png"))


def test_the_installed_command_exits_2_without_a_traceback(tmp_path):
    out = _mf("report", str(tmp_path / "absent"))
    assert out.returncode == 2 and out.stderr == f"mf report: error: {tmp_path / 'absent'}: no such directory\n"
