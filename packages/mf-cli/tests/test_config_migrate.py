"""`mf config migrate OLD [-o NEW] [--force]`, through the real entry point.

The old files are mf-config's realistic test data (packages/mf-config/tests/data/legacy). The
migrated configs are also handed to the packages that consume them (mf-models builds the model
arguments, mf-trainer the scheduler, mf-data the dataset settings), which checks mf-config's
copies of their key tables.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mf_cli.main import main
from mf_config import config_to_dict, load_config

REPO = Path(__file__).resolve().parents[3]
LEGACY = REPO / "packages" / "mf-config" / "tests" / "data" / "legacy"
FILES = sorted(p.name for p in LEGACY.glob("*.yaml"))
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


def _write(tmp_path, text: str, name: str = "old.yaml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_files_are_there():
    assert len(FILES) == 8


def _actions(path) -> list[str]:
    return [x[len("# action: "):] for x in Path(path).read_text(encoding="utf-8").splitlines()
            if x.startswith("# action: ")]


@pytest.mark.parametrize("name", FILES)
def test_a_migrated_file_passes_the_preflight_or_names_every_problem(name, tmp_path, capsys):
    """The contract of issue 18: whatever `mf config validate` (the preflight of the command that runs
    the file, for the old layout's world size) refuses in a migrated file is named by one of its action
    lines; a file with no action line passes."""
    from mf_config import migrate_legacy

    out = tmp_path / "new.yaml"
    assert main(["config", "migrate", str(LEGACY / name), "-o", str(out)]) == 0
    stdout, stderr = capsys.readouterr()
    assert stdout == ""
    assert f"mf config migrate: {LEGACY / name} -> {out}: " in stderr
    assert any(" translated — " in x for x in stderr.splitlines())
    world = migrate_legacy(LEGACY / name).world_size
    device = load_config(out, overrides=migrate_legacy(LEGACY / name).prompt_placeholder()).context.device_target
    argv = ["config", "validate", str(out), "--device", device or "CPU"] + (["--world", str(world)] if world > 1 else [])
    if "predict" in name:
        argv += ["--set", 'inference.prompts=["-"]']   # given by `mf generate --prompt` at run time
    code = main(argv)
    err = capsys.readouterr().err.splitlines()
    problems = [x.split("error: ", 1)[1] for x in err if x.startswith("mf config: error: ")]
    actions = _actions(out)
    assert (code == 0) == (not problems)
    for problem in problems:
        key = problem.split(":")[0]
        assert any(key in a for a in actions), (problem, actions)
    if not actions:
        assert code == 0 and stderr.rstrip().endswith("--prompt TEXT` or `mf serve " + str(out) + "`") or \
            "passes the preflight" in stderr


def test_report_on_stderr_and_yaml_on_stdout(tmp_path, capsys):
    old = _write(tmp_path, SMALL_OLD)
    assert main(["config", "migrate", old]) == 0
    stdout, stderr = capsys.readouterr()
    new = yaml.safe_load(stdout)
    assert new["parallelism"]["tensor_parallel"] == 2
    assert new["model"]["num_hidden_layers"] == 4 and "model_config" not in new["model"]
    assert new["training"] == {"local_batch_size": 1, "global_batch_size": 2, "steps": 400}  # 2 epochs x 400 // 2
    assert "  runner_config.sink_mode: dropped — data sinking has no equivalent in the new trainer" in stderr
    assert "  parallel_config.model_parallel: translated — parallelism.tensor_parallel: 2\n" in stderr
    assert (f"mf config migrate: {old} -> stdout: 10 translated, 1 dropped, 1 unneeded, 0 need action\n"
            "mf config migrate: passes the preflight; run it with `mf launch -n 4 NEW`\n") in stderr
    assert load_config(_write(tmp_path, stdout, "new.yaml")).training.steps == 400


def test_existing_output_needs_force(tmp_path, capsys):
    old, out = _write(tmp_path, SMALL_OLD), tmp_path / "train.yaml"
    out.write_text("keep me\n", encoding="utf-8")
    assert main(["config", "migrate", old, "-o", str(out)]) == 2
    assert capsys.readouterr() == ("", f"mf config: error: {out}: already exists; add --force to overwrite it\n")
    assert out.read_text(encoding="utf-8") == "keep me\n"
    assert main(["config", "migrate", old, "-o", str(out), "--force"]) == 0
    assert load_config(out).parallelism.tensor_parallel == 2


@pytest.mark.parametrize("text, message", [
    (None, "{old}: no such file"),
    ("runner_config:\n  epochs: [1,\n", "{old}: invalid YAML at line 3, column 1: "),
    ("training:\n  steps: 10\nmodel: {model_type: qwen3}\n",
     "{old}: already in the new format (it has training); check it with `mf config validate`"),
    ("seed: 1\noutput_dir: out\n", "{old}: not an older MindFormers run_xxx.yaml: none of runner_config"),
    ("- runner_config\n", "{old}: not an older MindFormers run_xxx.yaml: the top level must be a mapping, got list"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, text, message):
    old = str(tmp_path / "old.yaml") if text is None else _write(tmp_path, text)
    out = tmp_path / "train.yaml"
    assert main(["config", "migrate", old, "-o", str(out)]) == 2
    stdout, stderr = capsys.readouterr()
    assert stdout == "" and stderr.count("\n") == 1
    assert stderr.startswith("mf config: error: " + message.format(old=old))
    assert not out.exists()


def test_a_migration_that_does_not_validate_writes_nothing(tmp_path, capsys):
    old = _write(tmp_path, SMALL_OLD.replace("model_parallel: 2", "model_parallel: 3"))
    out = tmp_path / "train.yaml"
    assert main(["config", "migrate", old, "-o", str(out)]) == 2
    stderr = capsys.readouterr().err
    assert stderr.splitlines()[-1] == (
        f"mf config: error: {old}: the migrated config does not validate: parallelism.tensor_parallel: must divide "
        "model.num_attention_heads (4), got 3 (give it with --set parallelism.tensor_parallel=...)")
    assert not out.exists()


def test_output_directory_problems(tmp_path, capsys):
    old = _write(tmp_path, SMALL_OLD)
    assert main(["config", "migrate", old, "-o", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"mf config: error: {tmp_path}: is a directory; give a file name with -o\n"
    missing = tmp_path / "no" / "train.yaml"
    assert main(["config", "migrate", old, "-o", str(missing)]) == 2
    assert capsys.readouterr().err == (f"mf config: error: {missing}: the directory {missing.parent} does not "
                                       "exist\n")


def test_real_process(tmp_path):
    out = tmp_path / "train.yaml"
    cmd = [sys.executable, "-m", "mf_cli.main", "config", "migrate", str(LEGACY / FILES[0]), "-o", str(out)]
    ok = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and ok.stdout == "" and "Traceback" not in ok.stderr
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert (again.returncode, again.stderr) == (2, f"mf config: error: {out}: already exists; add --force to "
                                                   "overwrite it\n")


@pytest.mark.parametrize("name", FILES)
def test_consumers_accept_the_migrated_config(name, tmp_path, capsys):
    """mf-models builds the model arguments, mf-trainer the scheduler and mf-data the dataset settings
    from the migrated YAML."""
    mf_models = pytest.importorskip("mf_models")
    from mf_trainer import build_scheduler

    out = tmp_path / "train.yaml"
    assert main(["config", "migrate", str(LEGACY / name), "-o", str(out)]) == 0
    cfg = load_config(out, overrides=['inference.prompts=["-"]'] if "predict" in name else [])
    spec, args = mf_models.build_args(config_to_dict(cfg)["model"])
    assert args.num_hidden_layers == cfg.model.extra["num_hidden_layers"]
    scheduler = build_scheduler(cfg.lr_scheduler.type, cfg.lr_scheduler.learning_rate, cfg.lr_scheduler.extra,
                                cfg.training.steps)
    assert scheduler(0) >= 0.0
    assert cfg.optimizer.type == "AdamW" and cfg.optimizer.extra == {}  # mf-trainer's AdamW takes no extra keys
    data = cfg.train_dataset.dataloader.extra.get("config", {})
    if "data_path" in data:  # the Megatron loader's keys, carried as they were, are mf-data's
        import mf_data

        assert mf_data.gpt_config_from_dict(data).sequence_length == data["seq_length"]


def test_key_tables_match_the_consumers():
    """mf-config repeats mf-models' hyper-parameter names and mf-trainer's scheduler keys (it may not import
    them); the copies must stay equal."""
    mf_models = pytest.importorskip("mf_models")
    from mf_config.legacy.model_tables import MODEL_KEYS, SCHEDULER_KEYS
    from mf_trainer import SCHEDULERS

    for model_type, architecture in mf_models.available_models().items():
        spec = mf_models.resolve_spec(model_type)
        assert MODEL_KEYS[model_type] == frozenset(spec.args_cls.accepted_keys()), model_type
        assert architecture
    assert set(SCHEDULER_KEYS) == set(SCHEDULERS)
    for name, cls in SCHEDULERS.items():
        assert SCHEDULER_KEYS[name] == frozenset(cls.KEYS) | frozenset(cls.ALIASES), name


# -- issue 18: --set, --summary, --report, the preflight's problems as actions, predict files ----------
MINDRECORD_OLD = SMALL_OLD.replace("""    type: BlendedMegatronDatasetDataLoader
    sizes: [400, 0, 0]
    config: {seq_length: 128, data_path: [/data/x_text_document]}""", """    type: MindDataset
    dataset_dir: /data/wiki.mindrecord""")


def test_preflight_problems_become_action_lines(tmp_path, capsys):
    """pipeline_stage 2 with context_parallel 2 migrates (the schema takes it) but `mf launch`
    refuses PP x CP: an action line names the key (PP x TP and PP x FSDP now run under 1f1b)."""
    old = _write(tmp_path, MINDRECORD_OLD.replace("model_parallel: 2",
                                                  "model_parallel: 2, pipeline_stage: 2, context_parallel: 2"))
    out = tmp_path / "new.yaml"
    assert main(["config", "migrate", old, "-o", str(out)]) == 0
    err = capsys.readouterr().err
    actions = _actions(out)
    assert any(a.startswith("parallelism.context_parallel: action — `mf launch` refuses it: 2 with pipeline_parallel "
                            "2 is not implemented") for a in actions), actions
    assert not any(a.startswith(("parallelism.tensor_parallel:", "parallelism.pipeline_parallel:")) for a in actions)
    assert any(a.startswith("train_dataset.data_loader.type: action — MindRecord data ('/data/wiki.mindrecord')")
               for a in actions)
    assert "`mf launch -n 8" not in err and "the 'action' lines need an edit" in err


def test_set_answers_actions_and_the_result_passes_the_dry_run(tmp_path, capsys):
    old, out, report = _write(tmp_path, MINDRECORD_OLD), tmp_path / "new.yaml", tmp_path / "report.txt"
    argv = ["config", "migrate", old, "-o", str(out), "--summary", "--report", str(report),
            "--set", "train_dataset.dataloader.config.data_path=[/data/wiki_text_document]",
            "--set", "training.steps=50"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert _actions(out) == []
    summary = [x for x in err.splitlines() if x.startswith("mf config migrate: ")]
    assert summary[0].endswith("0 need action (2 answered by --set)")
    assert summary[1] == f"mf config migrate: passes the preflight; run it with `mf launch -n 4 {out}`"
    assert " translated — " not in err  # --summary: the counts and the actions only
    text = report.read_text(encoding="utf-8").splitlines()
    assert text[0] == summary[0] and any(" translated — " in x for x in text[1:])
    cfg = load_config(out)
    assert cfg.train_dataset.dataloader.extra["config"]["data_path"] == ["/data/wiki_text_document"]
    assert "# With --set train_dataset.dataloader.config.data_path=" in out.read_text(encoding="utf-8")
    assert main(["train", str(out), "--dry-run", "--world", "4", "--set", "context.device_target=CPU"]) == 0


def test_bad_set_is_one_line_and_writes_nothing(tmp_path, capsys):
    old, out = _write(tmp_path, SMALL_OLD), tmp_path / "new.yaml"
    assert main(["config", "migrate", old, "-o", str(out), "--set", "training.steps=-3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "training.steps" in err and not out.exists()
    assert main(["config", "migrate", old, "-o", str(out), "--set", "nonsense"]) == 2
    assert capsys.readouterr().err.count("\n") == 1 and not out.exists()


def test_refused_architectures_are_one_line(tmp_path, capsys):
    old = _write(tmp_path, SMALL_OLD.replace("LlamaForCausalLM", "Baichuan13BV2ForCausalLM")
                 .replace("type: LlamaConfig", "type: BaichuanConfig"))
    assert main(["config", "migrate", old]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("mf config: error: model.arch.type: Baichuan13BV2ForCausalLM: mf has no such "
                                        "model") and err.count("\n") == 1


def test_predict_config_migrates_for_mf_generate(tmp_path, capsys):
    out = tmp_path / "predict.yaml"
    assert main(["config", "migrate", str(LEGACY / "predict_qwen2_7b_instruct.yaml"), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.rstrip().endswith(f"run it with `mf generate {out} --prompt TEXT` or `mf serve {out}`")
    new = yaml.safe_load(out.read_text(encoding="utf-8"))
    assert new["run_mode"] == "predict" and new["model"]["model_type"] == "qwen2"
    assert new["inference"]["top_k"] == 20 and "train_dataset" not in new
    assert main(["generate", str(out), "--dry-run", "--set", "context.device_target=CPU"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "mf generate: dry run: model: qwen2 (Qwen2ForCausalLM)" in lines
    assert lines[-1] == f"mf generate: dry run: {out} passes the preflight of mf generate; nothing was loaded or written"
