"""The hostile pass of issue 31 through the real entry point (`main(argv)`, what the `mf` console
script calls): each case is one table row, run as a user would, and ends in one clear line with
exit 2 (or the documented behaviour, exit 0), nothing damaged, no traceback, no hang.

Tables, by command: `mf plan` (costs, sizes, --png, --width, huge schedules, layouts `mf train`
refuses), `mf report` (--out over a run's files, damaged and huge metrics, a directory of runs with a
failed one), `mf config migrate` / YAML reading (its input overwritten, huge or endless files, deep
nesting, recursive aliases, long integers, base-60 numbers), `mf train` (an output inside another
run's checkpoints, /proc outputs probed before step 1, --device with --dry-run), `mf generate`
(prompt ids outside the vocabulary, the checkpoint's max_new_tokens, a fine-tune's dry run) and
`mf ckpt` (the name it answers to). mf-ckpt's own cases: packages/mf-ckpt/tests/test_hostile_ckpt.py.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest
import yaml

from mf_cli.main import main

# ---------------------------------------------------------------------------------------------- helpers
PLAN_YAML = {
    "model": {"model_type": "llama", "num_hidden_layers": 8, "num_attention_heads": 4, "hidden_size": 32,
              "vocab_size": 64, "seq_length": 128},
    "train_dataset": {"dataloader": {"type": "BlendedMegatronDatasetDataLoader"}},
    "training": {"steps": 2, "global_batch_size": 8, "local_batch_size": 1},
    "parallelism": {"pipeline_parallel": 2},
}
SMALL_OLD = """\
runner_config: {epochs: 2, batch_size: 1, sink_mode: True}
parallel_config: {data_parallel: 2, model_parallel: 2}
model:
  model_config: {type: LlamaConfig, num_layers: 4, num_heads: 4, hidden_size: 64, seq_length: 128, vocab_size: 256}
  arch: {type: LlamaForCausalLM}
train_dataset:
  data_loader:
    type: BlendedMegatronDatasetDataLoader
    sizes: [400, 0, 0]
    config: {seq_length: 128, data_path: [/data/x_text_document]}
"""


def _yaml(path: Path, data: dict) -> str:
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return str(path)


def _plan_yaml(tmp: Path, **changes) -> str:
    data = json.loads(json.dumps(PLAN_YAML))
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        data.setdefault(section, {})[key] = value
    return _yaml(tmp / "plan.yaml", data)


def _run_dir(tmp: Path, name: str = "run", lines: list[str] | None = None) -> Path:
    """A run directory as mf train leaves it: metrics.jsonl, config.yaml, a committed checkpoint marker."""
    run = tmp / name
    (run / "checkpoint").mkdir(parents=True)
    rows = lines if lines is not None else [json.dumps({"step": s, "loss": 5.0 - s * 0.1, "grad_norm": 1.0})
                                            for s in range(1, 5)]
    (run / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    (run / "config.yaml").write_text("output_dir: run\n")
    (run / "checkpoint" / "latest_checkpointed_iteration.txt").write_text("4\n")
    return run


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _check(capsys, code: int, expected: int, needle: str) -> str:
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    assert code == expected, (out, err)
    if expected == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1, err
        assert needle in lines[0], lines[0]
        return lines[0]
    assert needle in out + err, out + err
    return out + err


# ---------------------------------------------------------------------------------------------- mf plan
# (id, argv builder(tmp) -> argv, exit, needle, what must not exist afterwards(tmp) -> path)
PLAN = [
    ("costs-inf", lambda t: ["plan", _plan_yaml(t), "--costs", "inf,1,1"], 2, "F must be a positive finite number",
     None),
    ("device-memory-1e400GB", lambda t: ["plan", _plan_yaml(t), "--device-memory", "1e400GB"], 2,
     "not a size any device has", None),
    ("png-out.txt", lambda t: ["plan", _plan_yaml(t), "--png", str(t / "out.txt")], 2, "is not a .png file name",
     lambda t: t / "out.txt"),
    # it wrote DIR.png and said "drawn in DIR"
    ("png-a-directory", lambda t: ["plan", _plan_yaml(t), "--png", str(t)], 2, "is a directory",
     lambda t: Path(f"{t}.png")),
    ("width-0", lambda t: ["plan", _plan_yaml(t), "--width", "0"], 2, "--width: must be a positive integer", None),
    ("width-10^8", lambda t: ["plan", _plan_yaml(t), "--width", "100000000"], 2,
     "--width 100000000: the text timeline would be", None),
    ("global-batch-10^9-under-pp", lambda t: ["plan", _plan_yaml(t, training__global_batch_size=10 ** 9)], 2,
     "training.global_batch_size: 1,000,000,000 micro-batches per step", None),
    ("cp3-with-seq-128", lambda t: ["plan", _plan_yaml(t, parallelism__pipeline_parallel=1,
                                                        parallelism__context_parallel=3)], 2,
     "parallelism.context_parallel: a sequence of 128 tokens does not split", None),
    ("ulysses-cp2-with-3-heads", lambda t: ["plan", _plan_yaml(
        t, parallelism__pipeline_parallel=1, parallelism__context_parallel=2,
        parallelism__context_parallel_method="ulysses", model__num_attention_heads=3, model__hidden_size=48)], 2,
     "parallelism.context_parallel: 2 does not divide the 3 attention heads", None),
    # quadratic in stages before (2000 stages 42 s, 10^4 never ended): now linear, a plan in seconds
    ("2000-stages", lambda t: ["plan", _plan_yaml(t, parallelism__pipeline_parallel=2000,
                                                  model__num_hidden_layers=2000, training__global_batch_size=1)],
     0, "rank 1999: busy", None),
]


@pytest.mark.parametrize("case", PLAN, ids=[c[0] for c in PLAN])
def test_plan(case, tmp_path, capsys):
    _, argv, expected, needle, absent = case
    _check(capsys, main(argv(tmp_path)), expected, needle)
    if absent:
        assert not absent(tmp_path).exists()


def test_train_dry_run_refuses_the_huge_pipeline_step_too(tmp_path, corpus, capsys):
    """It ran out of memory after 41 s building the schedule; now the preflight's one line."""
    config = _train_yaml(tmp_path, corpus, parallelism={"pipeline_parallel": 2},
                         training={"steps": 2, "local_batch_size": 2, "global_batch_size": 10 ** 9})
    _check(capsys, main(["train", config, "--dry-run", "--world", "2"]), 2, "500,000,000 micro-batches per step")


# ---------------------------------------------------------------------------------------------- mf report
DEEP = "[" * 100_000 + "]" * 100_000


def _report_case(tmp: Path, kind: str) -> list[str]:
    run = _run_dir(tmp)
    if kind in ("metrics", "config", "marker"):
        target = {"metrics": run / "metrics.jsonl", "config": run / "config.yaml",
                  "marker": run / "checkpoint" / "latest_checkpointed_iteration.txt"}[kind]
        return ["report", str(run), "--out", str(target)]
    if kind == "png-over-text":
        (tmp / "notes.png").write_text("my notes")
        return ["report", str(run), "--out", str(tmp / "notes.png")]
    if kind == "deep":
        _run_dir(tmp, "deep", [json.dumps({"step": 1, "loss": 1.0}), DEEP, json.dumps({"step": 2, "loss": 1.0})])
        return ["report", str(tmp / "deep"), "--no-plot"]
    if kind == "long-int":
        _run_dir(tmp, "long", [json.dumps({"step": 1, "loss": 1.0}), '{"step": ' + "9" * 5000 + ', "loss": 1}',
                               json.dumps({"step": 3, "loss": 1.0})])
        return ["report", str(tmp / "long"), "--no-plot"]
    if kind == "with-a-failed-run":
        (tmp / "failed").mkdir()
        (tmp / "failed" / "error.log").write_text("Traceback ...\n")
        return ["report", str(run), str(tmp / "failed")]
    if kind == "again-over-its-png":
        _run_dir(tmp, "other")
        assert main(["report", str(run), str(tmp / "other")]) == 0
        return ["report", str(run), str(tmp / "other"), str(tmp / "report.png")]
    if kind == "50k-lines":
        rows = [json.dumps({"step": s, "loss": 1.0 + 1.0 / s, "grad_norm": 1.0}) for s in range(1, 50_001)]
        _run_dir(tmp, "long_run", rows)
        return ["report", str(tmp / "long_run"), "--no-plot"]
    raise AssertionError(kind)


# (id, exit, needle)
REPORT = [
    ("metrics", 2, "--out"),
    ("config", 2, "not a .png file name"),
    ("marker", 2, "not a .png file name"),
    ("png-over-text", 2, "exists and is not a PNG; refusing to replace it"),
    ("deep", 2, "metrics.jsonl:2: not a JSON object (nested too deeply)"),
    ("long-int", 2, "metrics.jsonl:2: not a JSON object"),
    ("with-a-failed-run", 0, "mf report: skipped"),
    ("again-over-its-png", 0, "left out"),
    ("50k-lines", 0, "steps 1-50000 (50000 recorded"),     # quadratic before (100k lines: 70-80 s)
]


@pytest.mark.parametrize("case", REPORT, ids=[c[0] for c in REPORT])
def test_report(case, tmp_path, capsys):
    kind, expected, needle = case
    argv = _report_case(tmp_path, kind)
    before = _snapshot(tmp_path)
    text = _check(capsys, main(argv), expected, needle)
    if expected == 2:
        assert _snapshot(tmp_path) == before      # the run's files as they were, no PNG anywhere
    if kind == "with-a-failed-run":
        assert "run (" in text and (tmp_path / "run" / "report.png").is_file()


@pytest.mark.parametrize("umask", [0o027])
def test_report_png_goes_into_the_run_and_follows_the_umask(tmp_path, capsys, monkeypatch, umask):
    run = _run_dir(tmp_path)
    monkeypatch.chdir(tmp_path)
    old = os.umask(umask)
    try:
        assert main(["report", "run"]) == 0
    finally:
        os.umask(old)
    assert "wrote run/report.png" in capsys.readouterr().out
    assert not (tmp_path / "report.png").exists()            # not the working directory
    assert stat.S_IMODE((run / "report.png").stat().st_mode) == 0o666 & ~umask


# ---------------------------------------------------------------------------------------------- migrate / YAML
def _migrate_case(tmp: Path, kind: str) -> list[str]:
    old = tmp / "old.yaml"
    old.write_text(SMALL_OLD)
    cases = {
        "report-is-the-input": ["config", "migrate", str(old), "--report", str(old)],
        "report-is-the-input-forced": ["config", "migrate", str(old), "--report", str(old), "--force"],
        "output-is-the-input-forced": ["config", "migrate", str(old), "-o", str(old), "--force"],
        "report-is-the-output": ["config", "migrate", str(old), "-o", str(tmp / "n.yaml"), "--report",
                                 str(tmp / "n.yaml")],
        "report-exists": ["config", "migrate", str(old), "--report", str(tmp / "kept.txt")],
    }
    (tmp / "kept.txt").write_text("mine\n")
    if kind in cases:
        return cases[kind]
    bad = tmp / "bad.yaml"
    if kind == "dev-zero":
        return ["config", "migrate", "/dev/zero"]
    if kind == "5MB":      # 50 MB took 151 s to migrate; anything over the 4 MiB cap is refused unread
        bad.write_text("model:\n  model_type: llama\n" + "".join(f"  k{i}: {i}.5\n" for i in range(400_000)))
    elif kind == "nested-5k":
        bad.write_text("model: " + "[" * 5_000 + "]" * 5_000 + "\n")     # beyond the parser's recursion
    elif kind == "recursive-alias":
        bad.write_text(SMALL_OLD + "context: &c {mode: 1, again: *c}\n")
    elif kind == "alias-bomb":
        levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
        levels += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 8)]
        bad.write_text(SMALL_OLD + "\n".join(levels) + "\n")
    elif kind == "5000-digits":
        bad.write_text(SMALL_OLD + "seed: " + "7" * 5000 + "\n")
    else:
        raise AssertionError(kind)
    return ["config", "migrate", str(bad)]


# (id, needle)
MIGRATE = [
    ("report-is-the-input", "--report {old}: is the file being migrated"),
    ("report-is-the-input-forced", "--report {old}: is the file being migrated"),
    ("output-is-the-input-forced", "-o {old}: is the file being migrated"),
    ("report-is-the-output", "is also -o; give the report its own file"),
    ("report-exists", "kept.txt: already exists; add --force to overwrite it"),
    ("dev-zero", "/dev/zero: is larger than 4 MiB: not a config file"),
    ("5MB", "bad.yaml: is larger than 4 MiB: not a config file"),
    ("nested-5k", "bad.yaml: invalid YAML: nested deeper than a config can be"),
    ("recursive-alias", "bad.yaml: invalid YAML: an alias refers to a mapping or list that contains it"),
    ("alias-bomb", "bad.yaml: invalid YAML: its aliases expand to more than 1,000,000 values"),
    ("5000-digits", "an integer of 5000 digits (at most 4300)"),
]


@pytest.mark.parametrize("case", MIGRATE, ids=[c[0] for c in MIGRATE])
def test_migrate(case, tmp_path, capsys):
    kind, needle = case
    argv = _migrate_case(tmp_path, kind)
    before = _snapshot(tmp_path)
    _check(capsys, main(argv), 2, needle.format(old=tmp_path / "old.yaml"))
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_migrate_outputs_follow_the_umask(tmp_path, capsys, umask):
    (tmp_path / "old.yaml").write_text(SMALL_OLD)
    old = os.umask(umask)
    try:
        assert main(["config", "migrate", str(tmp_path / "old.yaml"), "-o", str(tmp_path / "new.yaml"), "--report",
                     str(tmp_path / "report.txt")]) == 0
    finally:
        os.umask(old)
    for name in ("new.yaml", "report.txt"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~umask, name


# ---------------------------------------------------------------------------------------------- mf train
def _train_yaml(tmp: Path, corpus: str, **sections) -> str:
    cfg = {
        "output_dir": str(tmp / "out"),
        "context": {"mode": 1},
        "training": {"steps": 2, "local_batch_size": 2, "global_batch_size": 2},
        "lr_scheduler": {"learning_rate": 1e-3},
        "train_dataset": {"dataloader": {
            "type": "BlendedMegatronDatasetDataLoader", "datasets_type": "GPTDataset", "sizes": [100, 0, 0],
            "column_names": ["input_ids", "labels", "loss_mask", "position_ids"],
            "config": {"seq_length": 16, "split": "1,0,0", "eod": 1, "pad": 0, "create_attention_mask": False,
                       "data_path": ["1", corpus]}}, "num_parallel_workers": 1},
        "model": {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
                  "num_hidden_layers": 2, "num_attention_heads": 2, "max_position_embeddings": 32},
    }
    cfg.update(sections)
    return _yaml(tmp / "train.yaml", cfg)


def _run_a(tmp: Path) -> Path:
    """Run A: a committed checkpoint (what run B must never be put inside)."""
    import mf_ckpt

    mf_ckpt.save(str(tmp / "A" / "checkpoint"), 4, {"w": np.ones(4, np.float32)}, common={"step": 4})
    return tmp / "A" / "checkpoint"


# (id, extra argv builder(tmp) -> list, needle); every one exits 2 before step 1
TRAIN = [
    ("local-batch-1:30", lambda t: ["--set", "training.local_batch_size=1:30"],
     "training.local_batch_size: expected an integer, got '1:30'"),
    ("output-in-another-runs-iteration", lambda t: ["--set", f"output_dir={_run_a(t) / 'iteration_00000004'}"],
     "the checkpoint directory of another run"),
    ("output-is-another-runs-save-dir", lambda t: ["--set", f"output_dir={_run_a(t)}"],
     "the checkpoint directory of another run"),
    ("save-path-in-another-run", lambda t: ["--set", f"checkpoint.save_path={_run_a(t) / 'mine'}"],
     "checkpoint.save_path: "),
    ("device-without-dry-run", lambda t: ["--device", "CPU"], "--world, --device and --build-model go with --dry-run"),
    # permission bits say root may write /proc; the probe before step 1 finds it cannot
    ("save-path-in-proc", lambda t: ["--set", "checkpoint.save_path=/proc/mf-x"],
     "checkpoint.save_path: /proc/mf-x cannot be written"),
    ("output-dir-in-proc", lambda t: ["--set", "output_dir=/proc/mf-x"], "output_dir: /proc/mf-x cannot be written"),
]


@pytest.mark.parametrize("case", TRAIN, ids=[c[0] for c in TRAIN])
def test_train(case, tmp_path, corpus, capsys):
    _, extra, needle = case
    config = _train_yaml(tmp_path, corpus)
    argv = ["train", config, *extra(tmp_path)]
    before = _snapshot(tmp_path)
    _check(capsys, main(argv), 2, needle)
    assert _snapshot(tmp_path) == before            # run A whole; nothing of B written anywhere
    assert not Path("/proc/mf-x").exists()


def test_train_dry_run_takes_the_device_its_hint_names(tmp_path, corpus, capsys):
    config = _train_yaml(tmp_path, corpus)
    assert main(["train", config, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "--device CPU|Ascend" in out         # the checks it could not run name the flag ...
    assert main(["train", config, "--dry-run", "--device", "CPU"]) == 0     # ... which it takes
    out = capsys.readouterr().out
    assert "not checked" not in out and "nothing was written" in out


# ---------------------------------------------------------------------------------------------- mf generate
@pytest.fixture(scope="module")
def run_with_generation(tmp_path_factory):
    """A tiny llama checkpoint as mf-trainer saves one: hf_config, the generation defaults of its
    training YAML's inference section (max_new_tokens 12), its sentencepiece tokenizer carried."""
    from pydoc_data.topics import topics

    import mf_ckpt
    import mf_data
    import mf_models

    root = tmp_path_factory.mktemp("gen")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in list(topics.values())[:40]), encoding="utf-8")
    spm = str(root / "spm.model")
    mf_data.train_sentencepiece([str(corpus)], spm, 160)
    section = mf_models.tiny_model_section("llama", vocab_size=160, max_position_embeddings=48, initializer_range=0.5)
    model = mf_models.build_model(section, seed=2)
    common = {"step": 5, "hf_config": section, "hf_generation_config": {"max_new_tokens": 12, "do_sample": False}}
    mf_ckpt.save(str(root / "ckpt"), 5, mf_models.model_state(model), common=common,
                 assets=mf_ckpt.tokenizer_assets(mf_data.tokenizer_files(spm)))
    # a training YAML whose run is that checkpoint, without an inference section (as examples/tiny/lora.yaml)
    train = {"output_dir": str(root / "out"), "context": {"mode": 1}, "model": section,
             "checkpoint": {"save_path": str(root / "ckpt")}, "tokenizer": {"path": spm},
             "training": {"steps": 5, "local_batch_size": 1, "global_batch_size": 1},
             "train_dataset": {"dataloader": {"type": "BlendedMegatronDatasetDataLoader", "datasets_type": "GPTDataset",
                                              "sizes": [8, 0, 0], "config": {"seq_length": 16,
                                                                             "data_path": ["1", str(root / "x")]}}}}
    return {"ckpt": str(root / "ckpt"), "yaml": _yaml(root / "train.yaml", train), "root": root}


@pytest.mark.parametrize("source", ["ckpt", "yaml"])
def test_generate_prompt_ids_outside_the_vocabulary(run_with_generation, capsys, source):
    extra = ["--input", str(_ids_file(run_with_generation["root"]))] if source == "yaml" else ["--prompt-ids", "99999"]
    _check(capsys, main(["generate", run_with_generation[source], *extra, "--mode", "pynative"]), 2,
           "token id 99999 is outside the vocabulary [0, 160)")


def test_generate_input_line_nested_too_deeply(run_with_generation, tmp_path, capsys):
    deep = tmp_path / "deep.jsonl"
    deep.write_text(json.dumps({"prompt": "ok"}) + "\n" + DEEP + "\n")      # a RecursionError traceback before
    _check(capsys, main(["generate", run_with_generation["ckpt"], "--input", str(deep), "--mode", "pynative"]), 2,
           "deep.jsonl:2: not a JSON object")


def _ids_file(root: Path) -> Path:
    path = root / "ids.jsonl"
    path.write_text(json.dumps({"prompt_ids": [5, 99999]}) + "\n")
    return path


@pytest.mark.parametrize("source", ["ckpt", "yaml"])
def test_generate_uses_the_checkpoints_max_new_tokens(run_with_generation, tmp_path, capsys, source):
    """Without --max-new-tokens (and, for a YAML, without inference.max_new_tokens), the checkpoint's
    generation default (12) is used, fitted to the 48 positions; the schema's 128 would not fit."""
    out = tmp_path / "out.jsonl"
    assert main(["generate", run_with_generation[source], "--prompt", "The for statement", "--ignore-eos",
                 "--output", str(out), "--mode", "pynative"]) == 0
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["completion_tokens"] == 12, row
    capsys.readouterr()


def test_generate_dry_run_of_a_fine_tune_finds_its_base_model(run_with_generation, tmp_path, capsys):
    """The dry run completes the config as the real run does: a fine-tune without a model section
    takes its base's (the checkpoint's hf_config); it said "records no model" before."""
    finetune = {"run_mode": "finetune", "output_dir": str(tmp_path / "ft"), "context": {"mode": 1},
                "checkpoint": {"load_path": run_with_generation["ckpt"]},
                "tokenizer": {"path": str(run_with_generation["root"] / "spm.model")},
                "lora": {"target_modules": ".*wq"},
                "training": {"steps": 5, "local_batch_size": 1, "global_batch_size": 1},
                "train_dataset": {"dataloader": {"type": "BlendedMegatronDatasetDataLoader",
                                                 "datasets_type": "GPTDataset", "sizes": [8, 0, 0],
                                                 "config": {"seq_length": 16, "data_path": ["1", "x"]}}}}
    path = _yaml(tmp_path / "lora.yaml", finetune)
    assert main(["generate", path, "--prompt", "What does assert do?", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "note: model: taken from" in out and "passes the preflight of mf generate" in out
    assert "the checkpoint's max_new_tokens (else 128)" in out


# ---------------------------------------------------------------------------------------------- mf ckpt
def test_mf_ckpt_answers_to_its_name(capsys):
    with pytest.raises(SystemExit):
        main(["ckpt", "--help"])
    assert capsys.readouterr().out.startswith("usage: mf ckpt ")
    assert main(["ckpt", "inspect", "/no/such/ckpt"]) == 2
    assert capsys.readouterr().err.startswith("mf ckpt: error: ")


@pytest.mark.parametrize("key, value, needle", [
    ("rms_norm_eps", float("nan"), "rms_norm_eps must be a finite number > 0, got nan"),   # generated "⁇", exit 0
    ("max_position_embeddings", 0, "max_position_embeddings"),
])
def test_generate_refuses_a_config_json_the_model_cannot_run(hf_fixtures, tmp_path, capsys, key, value, needle):
    import shutil

    hf = tmp_path / "hf"
    shutil.copytree(hf_fixtures / "llama", hf)
    config = json.loads((hf / "config.json").read_text())
    config[key] = value
    (hf / "config.json").write_text(json.dumps(config))
    _check(capsys, main(["generate", str(hf), "--prompt-ids", "1,2,3", "--max-new-tokens", "2"]), 2, needle)
