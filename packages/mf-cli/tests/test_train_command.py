"""`mf train`, `mf data`, `mf ckpt` through the real entry point (a subprocess running `mf`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from mf_cli.main import main


def _mf(*args, cwd=None):
    env = {**os.environ, "GLOG_v": "3"}
    return subprocess.run([sys.executable, "-m", "mf_cli.main", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=600)


def _yaml(tmp_path, corpus, **changes) -> str:
    cfg = {
        "output_dir": str(tmp_path / "out"),
        "training": {"steps": 2, "local_batch_size": 2, "global_batch_size": 2},
        "lr_scheduler": {"learning_rate": 1e-3},
        "train_dataset": {"dataloader": {
            "type": "BlendedMegatronDatasetDataLoader", "datasets_type": "GPTDataset", "sizes": [100, 0, 0],
            "column_names": ["input_ids", "labels", "loss_mask", "position_ids"],
            "config": {"seq_length": 16, "split": "1,0,0", "eod": 1, "pad": 0, "create_attention_mask": False,
                       "data_path": ["1", corpus]}}, "num_parallel_workers": 1},
        "model": {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
                  "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 32},
        "monitor": {"peak_flops_per_device": 1e11},
    }
    for section, value in changes.items():
        cfg[section] = {**cfg.get(section, {}), **value}
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_train_runs_saves_and_reports(tmp_path, corpus):
    out = _mf("train", _yaml(tmp_path, corpus), "--set", "training.steps=3")
    assert out.returncode == 0, out.stderr
    assert "step 3/3" in out.stdout
    assert out.stdout.splitlines()[-1].startswith("mf train: done at step 3, final loss ")
    rows = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]
    # the delegated checkpoint tool reads what training wrote
    inspect = _mf("ckpt", "inspect", str(tmp_path / "out" / "checkpoint"))
    assert inspect.returncode == 0, inspect.stderr
    assert "tok_embeddings.weight" in inspect.stdout


@pytest.mark.parametrize("args, message", [
    (["--set", "training.stpes=3"], "mf train: error: training.stpes: unknown key; did you mean 'steps'?"),
    (["--set", "model.hiden_size=8"], "mf train: error: model.hiden_size: unknown key for llama"),
    (["--set", "parallelism.tensor_parallel=2"], "mf train: error: parallelism.tensor_parallel: 2 > 1 needs 2 ranks"),
    (["--set", "lr_scheduler.type=Cosine"], "mf train: error: lr_scheduler.type: unknown scheduler 'Cosine'"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, corpus, capsys, args, message):
    # in-process (the same main() the console script calls), to spare a MindSpore start per case
    assert main(["train", _yaml(tmp_path, corpus), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "out" / "checkpoint").exists()


def test_missing_data_and_missing_yaml_exit_2(tmp_path, corpus, capsys):
    data_path = f"train_dataset.dataloader.config.data_path=['1', '{tmp_path}/none']"
    assert main(["train", _yaml(tmp_path, corpus), "--set", data_path]) == 2
    err = capsys.readouterr().err
    assert "none.idx" in err and err.count("\n") == 1
    assert main(["train", str(tmp_path / "absent.yaml")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_failure_during_training_exits_1_with_the_reason(tmp_path, corpus):
    # An absurd learning rate blows the weights up; every later step is non-finite.
    path = _yaml(tmp_path, corpus, context={"mode": 1}, training={"steps": 4, "max_consecutive_nonfinite": 1},
                 lr_scheduler={"learning_rate": 1e30})
    out = _mf("train", path)
    assert out.returncode == 1, out.stdout + out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("mf train: training failed: 1 non-finite steps in a row")
    assert "error.log" in last and (tmp_path / "out" / "error.log").read_text().startswith("Traceback")


def test_data_commands_are_delegated(tmp_path):
    out = _mf("data", "make-demo-corpus", str(tmp_path / "demo"))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "demo" / "corpus.jsonl").stat().st_size > 100_000
    out = _mf("data", "no-such-tool")
    assert out.returncode == 2


class _CreatesAFile:
    """Unpickling this calls open(path, "w"): the file appearing would prove the state was unpickled."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_pickled_rng_state_is_refused_never_unpickled(tmp_path, corpus, capsys):
    import base64
    import glob
    import pickle

    path = _yaml(tmp_path, corpus)
    assert main(["train", path]) == 0
    capsys.readouterr()
    ckpt = tmp_path / "out" / "checkpoint"
    common_path = glob.glob(str(ckpt / "iteration_*" / "common.json"))[0]
    stored = json.loads(open(common_path).read())          # mf-ckpt's envelope: the trainer's dict is "common"
    rng = stored["common"]["rng"]
    assert isinstance(rng["python"]["state"], list) and isinstance(rng["numpy"]["keys"], list)   # JSON data now
    # What mf-trainer < 0.4 wrote: base64 pickles; this one would create a file when unpickled.
    marker = tmp_path / "unpickled"
    rng["python"] = base64.b64encode(pickle.dumps(_CreatesAFile(str(marker)))).decode("ascii")
    with open(common_path, "w") as f:
        json.dump(stored, f)
    resume = ["train", path, "--set", "training.steps=3", "--set", f"checkpoint.load_path={ckpt}",
              "--set", f"output_dir={tmp_path / 'resumed'}"]
    assert main(resume) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"mf train: error: checkpoint.load_path: {os.path.dirname(common_path)}/common.json: rng: "
                          "stored pickled (written by mf-trainer < 0.4), which is never unpickled")
    assert "checkpoint.load_rng_state: false" in err
    assert not marker.exists()
    # the explicit option resumes without the RNG state (and still never reads the pickle)
    assert main([*resume, "--set", "checkpoint.load_rng_state=false"]) == 0
    assert "done at step 3" in capsys.readouterr().out
    assert not marker.exists()


def test_resume_from_a_damaged_checkpoint_is_one_line_exit_2(tmp_path, corpus, capsys):
    """`mf train` resuming (issue 17): a damaged counter in common.json and a flipped byte in the
    tensor data are each one line naming the file (and the field), exit 2; nothing trains."""
    import shutil
    import struct

    (tmp_path / "a").mkdir()
    assert main(["train", _yaml(tmp_path / "a", corpus)]) == 0
    ckpt = tmp_path / "a" / "out" / "checkpoint"
    it = ckpt / "iteration_00000002"
    capsys.readouterr()

    def resume(name: str) -> str:
        copy = tmp_path / name
        copy.mkdir(exist_ok=True)
        path = _yaml(copy, corpus, checkpoint={"load_path": str(copy / "ck")}, training={"steps": 3})
        assert main(["train", path]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err and not (copy / "out" / "metrics.jsonl").exists(), err
        return err

    shutil.copytree(ckpt, tmp_path / "step" / "ck")
    common = tmp_path / "step" / "ck" / it.name / "common.json"
    info = json.loads(common.read_text())
    info["common"]["step"] = "abc"
    common.write_text(json.dumps(info))
    assert f"{common}: step: must be a non-negative integer, got 'abc'" in resume("step")

    shutil.copytree(ckpt, tmp_path / "flip" / "ck")
    shard = tmp_path / "flip" / "ck" / it.name / "checkpoint-model-0000000-0000001.safetensors"
    data = bytearray(shard.read_bytes())
    data[8 + struct.unpack("<Q", data[:8])[0] + 40] ^= 0x01
    shard.write_bytes(bytes(data))
    err = resume("flip")
    assert err.startswith("mf train: error: checkpoint.load_path: ") and "checksum mismatch" in err
