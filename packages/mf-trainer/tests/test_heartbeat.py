"""training.hang_timeout_s: the rank's heartbeat under `mf launch`, and the one line saying it has
nothing to watch in a process no launcher started (the launched path runs in
tests-integration/dist/test_multinode.py: a SIGSTOPped rank named with its step)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

from mf_trainer.heartbeat import watch_for_hangs


def test_without_a_launcher_a_set_timeout_is_said_once(monkeypatch, caplog):
    monkeypatch.delenv("MF_LAUNCH_STATUS_DIR", raising=False)
    with caplog.at_level(logging.INFO, logger="mf_trainer"):
        assert watch_for_hangs(600.0) is None
        assert caplog.messages == []                  # the default: nothing to say
        assert watch_for_hangs(30.0) is None
    assert caplog.messages == ["training.hang_timeout_s: 30 s has nothing to watch here (no mf launch around this "
                               "process: the hang watchdog is the launcher's)"]


def test_under_a_launcher_the_rank_beats_with_its_timeout(tmp_path):
    code = ("import time\nfrom mf_trainer.heartbeat import watch_for_hangs\n"
            "beat = watch_for_hangs(45.0); beat.at(3, 'evaluating'); time.sleep(1.3)\n")
    env = {**os.environ, "MF_LAUNCH_STATUS_DIR": str(tmp_path), "RANK_ID": "2"}
    env.pop("MS_ROLE", None)
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    beat = json.loads((tmp_path / "rank_2.heartbeat").read_text())
    assert (beat["step"], beat["phase"], beat["timeout"], beat["setting"]) == (3, "evaluating", 45.0,
                                                                                "training.hang_timeout_s")
