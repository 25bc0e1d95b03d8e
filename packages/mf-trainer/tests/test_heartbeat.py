"""training.hang_timeout_s: the rank's heartbeat under `mf launch`, and the one notice saying it has
nothing to act on in a process no launcher started (the launched path runs in
tests-integration/dist/test_multinode.py: a SIGSTOPped rank named with its step)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from mf_trainer.heartbeat import watch_for_hangs


def test_without_a_launcher_a_set_timeout_is_one_notice(monkeypatch):
    import mf_config
    import mf_trainer

    raw = {"training": {"steps": 2}, "model": {"model_type": "llama", "vocab_size": 64, "hidden_size": 32,
                                               "intermediate_size": 64, "num_hidden_layers": 1,
                                               "num_attention_heads": 4, "max_position_embeddings": 32},
           "train_dataset": {"dataloader": {"type": "BlendedMegatronDatasetDataLoader", "datasets_type": "GPTDataset",
                                            "sizes": [8, 0, 0], "config": {"seq_length": 16, "data_path": ["x"]}}}}

    def notices(timeout, launched):
        if launched:
            monkeypatch.setenv("MF_LAUNCH_STATUS_DIR", "/somewhere")
        else:
            monkeypatch.delenv("MF_LAUNCH_STATUS_DIR", raising=False)
        cfg = mf_config.load_config({**raw, "training": {**raw["training"], "hang_timeout_s": timeout}})
        report = mf_trainer.preflight(cfg, "train", 1, "CPU", files=False)
        return [n.line() for n in report.notices if n.key == "training.hang_timeout_s"]

    assert notices(600, launched=False) == []                     # the default: nothing to say
    assert notices(30, launched=False) == ["notice: training.hang_timeout_s: 30 s: the hang watchdog is mf launch's "
                                           "(its launcher watches every rank's heartbeat); a run started without it "
                                           "has none"]
    assert notices(30, launched=True) == []                       # a rank mf launch started: watched
    monkeypatch.delenv("MF_LAUNCH_STATUS_DIR")
    assert watch_for_hangs(30.0) is None                          # and no heartbeat nobody reads


def test_under_a_launcher_the_rank_beats_with_its_timeout(tmp_path):
    code = ("import time\nfrom mf_trainer.heartbeat import watch_for_hangs\n"
            "beat = watch_for_hangs(45.0); beat.at(3, 'evaluating'); time.sleep(1.3)\n")
    env = {**os.environ, "MF_LAUNCH_STATUS_DIR": str(tmp_path), "RANK_ID": "2"}
    env.pop("MS_ROLE", None)
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    beat = json.loads((tmp_path / "rank_2.heartbeat").read_text())
    assert (beat["step"], beat["phase"], beat["timeout"], beat["setting"]) == (3, "evaluating", 45.0,
                                                                                "training.hang_timeout_s")
