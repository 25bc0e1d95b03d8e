"""`mf launch`: what is decided before any rank starts (the multi-process runs are in
tests-integration/dist/test_mf_launch.py, under msrun)."""

from __future__ import annotations

import pytest
import yaml

from mf_cli.commands.launch import RANK_SCRIPT
from mf_cli.main import main


def _yaml(tmp_path, **sections) -> str:
    cfg = {"output_dir": str(tmp_path / "out"),
           "training": {"steps": 2, "local_batch_size": 1, "global_batch_size": 4},
           "train_dataset": {"dataloader": {
               "type": "BlendedMegatronDatasetDataLoader", "datasets_type": "GPTDataset", "sizes": [100, 0, 0],
               "column_names": ["input_ids", "labels", "loss_mask"],
               "config": {"seq_length": 16, "split": "1,0,0", "data_path": ["1", str(tmp_path / "none")]}}},
           "model": {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
                     "num_hidden_layers": 1, "num_attention_heads": 4, "max_position_embeddings": 32},
           **sections}
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


@pytest.mark.parametrize("args, message", [
    (["-n", "1", "--set", "parallelism.tensor_parallel=2"],
     "mf launch: error: parallelism: pipeline_parallel (1) x context_parallel (1) x tensor_parallel (2) = 2 does not "
     "divide the world size 1; pick degrees whose product divides 1 (mf launch starts 1 rank)"),
    (["-n", "4", "--set", "parallelism.data_parallel_shard=3"],
     "mf launch: error: parallelism.data_parallel_shard: 3 does not divide the data-parallel size 4"),
    (["-n", "0"], "mf launch: error: -n/--nproc: must be a positive integer, got 0"),
    (["-n", "2", "--nodes", "2", "--node-rank", "2"], "mf launch: error: --node-rank must be in 0..1, got 2"),
    (["-n", "2", "--nodes", "2"], "mf launch: error: --master-port is required with more than one node"),
    (["-n", "2", "--set", "training.stpes=3"], "mf launch: error: training.stpes: unknown key; did you mean 'steps'?"),
])
def test_bad_input_exits_2_before_any_rank_starts(tmp_path, capsys, args, message):
    path = _yaml(tmp_path)
    assert main(["launch", *args[:2], path, *args[2:]] if args[0] == "-n" else ["launch", path, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()          # nothing written: no rank started


def test_missing_yaml_exits_2(tmp_path, capsys):
    assert main(["launch", "-n", "2", str(tmp_path / "absent.yaml")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_each_rank_runs_mf_train():
    # The rank script sits alone in its directory (the rank entry puts it first on sys.path).
    assert sorted(p.name for p in RANK_SCRIPT.parent.iterdir() if p.suffix == ".py") == ["mf_train_rank.py"]
    assert 'main(["train", *sys.argv[1:]])' in RANK_SCRIPT.read_text()


def test_the_console_leaves_out_mindspores_own_info_lines():
    import io

    from mf_cli.commands.launch import ConsoleFilter

    out = io.StringIO()
    console = ConsoleFilter(out)
    # MindSpore's glog lines arrive with the rank's own, in pieces split anywhere
    text = ("[mf_trainer] step 1/3 | loss 7.6\n[INFO] DISTRIBUTED(4242,7f,python):2026-12-01-10:00:00.1 [comm.cc:1] "
            "Finalize\n[WARNING] ME(4242,7f,python): kept\n[DEBUG] PIPELINE(1,2,python): x\n[mf_trainer] [INFO] my own")
    for i in range(0, len(text), 7):
        console.write(text[i:i + 7])
    console.flush()
    assert out.getvalue() == ("[mf_trainer] step 1/3 | loss 7.6\n[WARNING] ME(4242,7f,python): kept\n"
                              "[mf_trainer] [INFO] my own")


def test_a_failed_job_names_where_a_rerun_resumes(tmp_path):
    import numpy as np

    import mf_ckpt
    import mf_config
    from mf_cli.commands.launch import resume_note

    cfg = mf_config.load_config(yaml.safe_load(open(_yaml(tmp_path))))
    save_path = cfg.checkpoint.save_path
    assert resume_note(cfg.checkpoint) == f"no checkpoint committed in {save_path} yet (a rerun starts over)"
    mf_ckpt.save(save_path, 4, {"w": np.ones(2, np.float32)})
    (tmp_path / "out" / "checkpoint" / ".iteration_00000005.x.incomplete").mkdir()    # cut short by the failure
    assert resume_note(cfg.checkpoint, nodes=2) == (
        f"last committed checkpoint: {save_path}/iteration_00000004 (rerun the same command on every node to resume "
        "from it)")
    off = mf_config.load_config(yaml.safe_load(open(_yaml(tmp_path, checkpoint={"enable_save": False}))))
    assert resume_note(off.checkpoint) == "no checkpoints saved (checkpoint.enable_save: false): a rerun starts over"

