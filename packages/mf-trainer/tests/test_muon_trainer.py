"""Muon through the Trainer: the tiny llama learns, the checkpoint holds the momentum buffers, and an
interrupted run resumed from its checkpoint continues with the same losses, bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import mf_config
import mf_models
from mf_trainer import Muon, StopAtStep, Trainer

ONE_GRAPH = {"local_batch_size": 2, "global_batch_size": 2}
MUON = {"type": "Muon", "weight_decay": 0.1, "momentum": 0.9}


def _raw(tiny_config, out, corpus):
    return tiny_config(out, corpus, training=ONE_GRAPH, optimizer=MUON,
                       checkpoint={"save_interleaved_steps": 3, "save_max": 2})


def test_muon_learns_and_resumes_bit_for_bit(tmp_path, tiny_corpus, tiny_config):
    full_raw = _raw(tiny_config, tmp_path / "full", tiny_corpus)
    full = Trainer(mf_config.load_config(full_raw))
    assert isinstance(full.optimizer, Muon) and full.mode == 0          # compiled step
    assert "layers.0.attention.wq.weight" in full.optimizer.muon_names
    assert "tok_embeddings.weight" not in full.optimizer.muon_names
    full_result = full.train()
    assert len(full_result.losses) == 6 and full_result.losses[-1] < full_result.losses[0] - 0.2

    raw = _raw(tiny_config, tmp_path / "split", tiny_corpus)
    first = Trainer(mf_config.load_config(raw), callbacks=[StopAtStep(3)]).train()
    assert first.step == 3 and first.checkpoint.endswith("iteration_00000003")
    metadata = (Path(first.checkpoint) / "metadata.json").read_text()
    assert '"momentum.layers.0.attention.wq.weight"' in metadata and '"exp_avg.tok_embeddings.weight"' in metadata
    assert '"exp_avg.layers.0.attention.wq.weight"' not in metadata
    resumed = Trainer(mf_config.load_config({**raw, "checkpoint": {**raw["checkpoint"],
                                                                   "load_path": str(tmp_path / "split" / "checkpoint")}}))
    assert resumed.state.step == 3 and resumed.optimizer.step == 3
    buf = resumed.optimizer.state_dict()["momentum.layers.1.feed_forward.w2.weight"]
    assert np.abs(buf).max() > 0                                     # the momentum came back from the checkpoint
    second = resumed.train()
    assert first.losses + second.losses == full_result.losses       # exact float equality
    want, got = mf_models.model_state(full.model), mf_models.model_state(resumed.model)
    assert all(np.array_equal(want[k], got[k]) for k in want)
