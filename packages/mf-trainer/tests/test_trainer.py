"""The Trainer end to end on a 2-layer llama over a corpus written with mf-data's builder."""

from __future__ import annotations

import json

import numpy as np
import pytest

import mf_config
import mf_models
from mf_trainer import Callback, StopAtStep, Trainer, register_callback


@register_callback
class RecordHooks(Callback):
    calls: list = []

    def __init__(self, tag: str = "x"):
        RecordHooks.calls = []

    def on_train_begin(self, trainer):
        self.calls.append(("begin", trainer.state.step))

    def on_step_begin(self, trainer, step):
        self.calls.append(("step_begin", step))

    def on_step_end(self, trainer, metrics):
        self.calls.append(("step_end", metrics["step"]))

    def on_save(self, trainer, step, path):
        self.calls.append(("save", step))

    def on_train_end(self, trainer):
        self.calls.append(("end", trainer.state.step))


ONE_GRAPH = {"local_batch_size": 2, "global_batch_size": 2}


def _trainer(raw, callbacks=()):
    return Trainer(mf_config.load_config(raw), callbacks=list(callbacks))


def _weights(trainer):
    return {k: v.copy() for k, v in mf_models.model_state(trainer.model).items()}


@pytest.fixture(scope="module")
def tokenizer_model(tmp_path_factory):
    from pydoc_data.topics import topics

    import mf_data

    d = tmp_path_factory.mktemp("spm")
    corpus = d / "c.jsonl"
    # lower-case letters and spaces only: few enough characters for a 60-piece vocabulary
    texts = ["".join(c for c in topics[t].lower() if c.isascii() and (c.isalpha() or c == " "))
             for t in sorted(topics)[:20]]
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    mf_data.train_sentencepiece([str(corpus)], str(d / "t.model"), 60)
    return str(d / "t.model")


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, tiny_corpus, tokenizer_model, tiny_config):
    """6 uninterrupted steps, with every optional feature that does not change the numbers."""
    out = tmp_path_factory.mktemp("full")
    # accumulation 1 here (one compiled graph per run, three runs); the accumulating path is resumed
    # in tests-integration and checked against one big batch in test_step
    raw = tiny_config(out, tiny_corpus, training=ONE_GRAPH,
                      checkpoint={"save_interleaved_steps": 2, "save_max": 2},
                      recompute={"mode": "select", "select_module": {"attention": ["0"]}},
                      profiler={"enable_profiling": True, "start_step": 2, "end_step": 2},
                      callbacks=[{"type": "RecordHooks", "tag": "full"}],
                      tokenizer={"path": tokenizer_model},
                      monitor={"train_state": {"local_norm": "."}},    # every parameter's own norm
                      inference={"prompts": ["The for statement", "x"], "max_new_tokens": 5,
                                 "batch_size": 2, "output_file": str(out / "samples.jsonl")})
    trainer = _trainer(raw)
    result = trainer.train()
    return trainer, result, out, list(RecordHooks.calls)


def test_loss_falls_and_metrics_are_written(full_run):
    trainer, result, out, _ = full_run
    assert result.step == 6 and len(result.losses) == 6
    assert result.losses[-1] < result.losses[0] - 0.2
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in rows] == pytest.approx(result.losses, rel=0, abs=0)
    for key in ("lr", "grad_norm", "step_time_s", "tokens_per_s", "mfu", "rss_bytes", "consumed_samples"):
        assert all(key in r for r in rows), key
    assert rows[-1]["consumed_samples"] == 6 * 2
    # CosineWithWarmUpLR, warmup 2 of 6 steps: 0, lr/2, lr, then the cosine at progress 1/4
    assert [r["lr"] for r in rows[:3]] == [0.0, 1.5e-3, 3e-3]
    assert rows[3]["lr"] == pytest.approx(1e-4 + (3e-3 - 1e-4) * 0.5 * (1 + np.cos(np.pi / 4)), rel=1e-12)
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))


def _tensorboard_tags(directory) -> set[str]:
    """The scalar tags of the run's events, as TensorBoard's own reader sees them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    acc.Reload()
    return set(acc.Tags()["scalars"])


def test_local_norm_records_each_parameter_norm(full_run):
    """monitor.train_state.local_norm '.': every trained parameter's grad_norm/<name> in each step
    record and in TensorBoard; their squares add up to the global grad_norm (what clipping uses)."""
    trainer, _, out, _ = full_run
    names = [name for name, _ in trainer.model.parameters_and_names()]
    rows = [r for r in (json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    for r in rows:
        norms = [r[f"grad_norm/{n}"] for n in names]
        assert all(v > 0 for v in norms)
        assert float(np.sqrt(np.sum(np.square(norms, dtype=np.float64)))) == pytest.approx(r["grad_norm"], rel=1e-5)
    tags = _tensorboard_tags(out / "tensorboard")
    assert {f"train/grad_norm/{n}" for n in names} <= tags and "train/grad_norm" in tags


def test_local_norm_matching_no_parameter_is_one_keyed_line(tmp_path, tiny_corpus, tiny_config):
    from mf_trainer import TrainerConfigError

    raw = tiny_config(tmp_path, tiny_corpus, monitor={"train_state": {"local_norm": "^wq$"}})
    with pytest.raises(TrainerConfigError) as err:
        _trainer(raw)
    assert str(err.value).startswith("monitor.train_state.local_norm: '^wq$' matches no trained parameter")


def test_checkpoints_rotate_and_hooks_fire_in_order(full_run):
    trainer, result, out, calls = full_run
    ckpt = out / "checkpoint"
    assert sorted(p.name for p in ckpt.glob("iteration_*")) == ["iteration_00000004", "iteration_00000006"]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "6"
    assert result.checkpoint.endswith("iteration_00000006")
    expected = [("begin", 0)]
    for step in range(1, 7):
        expected += [("step_begin", step), ("step_end", step)] + ([("save", step)] if step % 2 == 0 else [])
    assert calls == expected + [("end", 6)]
    common = json.loads((ckpt / "iteration_00000006" / "common.json").read_text())
    blob = json.dumps(common)
    for key in ("consumed_samples", "optimizer_step", "rng", "hf_config", "train_config", "lr_schedule"):
        assert key in blob


def test_every_checkpoint_carries_its_tokenizer_and_generation_config(full_run, tokenizer_model):
    import mf_ckpt
    import mf_data

    _, _, out, _ = full_run
    for it in ("iteration_00000004", "iteration_00000006"):
        carried = mf_ckpt.find_tokenizer(out / "checkpoint" / it)     # checked against metadata.json
        assert carried.kind == "sentencepiece"
        assert carried.files["tokenizer.model"].read_bytes() == open(tokenizer_model, "rb").read()
    # what mf generate / mf serve load from the copy: the same tokenizer
    copy = mf_data.load_tokenizer(carried.path)
    assert copy.encode(["the for statement"]) == mf_data.SentencePieceTokenizer(tokenizer_model).encode(
        ["the for statement"])
    common = json.loads((out / "checkpoint" / "iteration_00000006" / "common.json").read_text())["common"]
    generation = common["hf_generation_config"]
    # the YAML's inference settings away from their defaults, the tokenizer's EOS as the stop id
    assert generation["max_new_tokens"] == 5 and generation["eos_token_id"] == copy.eod


def test_profiler_and_end_of_training_sample(full_run):
    _, result, out, _ = full_run
    assert list((out / "profile").rglob("*.csv")) or list((out / "profile").rglob("*.json"))
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in rows] == ["The for statement", "x"] and rows == result.samples
    assert all(isinstance(r["completion"], str) for r in rows)


def test_interrupted_and_resumed_run_matches_bit_for_bit(full_run, tmp_path, tiny_corpus, tiny_config):
    full_trainer, full_result, _, _ = full_run
    raw = tiny_config(tmp_path, tiny_corpus, training=ONE_GRAPH, checkpoint={"save_interleaved_steps": 2, "save_max": 2},
                      recompute={"mode": "select", "select_module": {"attention": ["0"]}})
    first = _trainer(raw, [StopAtStep(3)]).train()
    assert first.step == 3 and first.checkpoint.endswith("iteration_00000003")
    resumed_trainer = _trainer({**raw, "checkpoint": {**raw["checkpoint"],
                                                      "load_path": str(tmp_path / "checkpoint")}})
    assert resumed_trainer.state.step == 3 and resumed_trainer.optimizer.step == 3
    second = resumed_trainer.train()
    assert first.losses + second.losses == full_result.losses  # exact float equality
    full_w, resumed_w = _weights(full_trainer), _weights(resumed_trainer)
    assert all(np.array_equal(full_w[k], resumed_w[k]) for k in full_w)
    # metrics.jsonl holds one line per step of the combined history
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4, 5, 6]
    assert [(r["step"], "start" in r) for r in rows if "start" in r] == [(0, True), (3, True)]   # two sessions


def _set(key, value):
    return lambda common: common.update({key: value})


def _drop(key):
    return lambda common: common.pop(key)


DAMAGED_RESUME = [
    # (id, change to common.json's "common", the field the one line names)
    ("step-abc", _set("step", "abc"), "step: must be a non-negative integer, got 'abc'"),
    ("step-negative", _set("step", -3), "step: must be a non-negative integer, got -3"),
    ("step-float", _set("step", 2.5), "step: must be a non-negative integer, got 2.5"),
    ("step-bool", _set("step", True), "step: must be a non-negative integer, got True"),
    ("consumed-missing", _drop("consumed_samples"), "consumed_samples: missing"),
    ("optimizer-step-list", _set("optimizer_step", [1]), "optimizer_step: must be a non-negative integer"),
    ("skipped-negative", _set("skipped_steps", -1), "skipped_steps: must be a non-negative integer"),
    ("rng-missing", _drop("rng"), "rng: missing"),
    ("rng-a-string", _set("rng", "seeded"), "rng: must be an object"),
    ("rng-numpy-keys-short", lambda c: c["rng"]["numpy"].update(keys=[1, 2]), "rng.numpy.keys: must be a list of 624"),
    ("rng-python-state-huge", lambda c: c["rng"]["python"]["state"].__setitem__(0, 2 ** 40),
     "rng.python.state: must be a list of 625 integers in [0, 4294967296)"),
    ("rng-mindspore-short", lambda c: c["rng"].update(mindspore=[1, 2, 3]), "rng.mindspore: must be a list of"),
    ("rng-python-garbage", lambda c: c["rng"].update(python="AAAA"), "rng: stored pickled"),
    ("rng-python-version", lambda c: c["rng"]["python"].update(version="x"), "rng: not a state mf-trainer wrote"),
]


@pytest.mark.parametrize("case", DAMAGED_RESUME, ids=[c[0] for c in DAMAGED_RESUME])
def test_damaged_resume_state_is_one_keyed_line(full_run, tmp_path, tiny_corpus, tiny_config, case):
    import shutil

    from mf_trainer import TrainerConfigError

    _, change, needle = case
    _, _, out, _ = full_run
    ckpt = tmp_path / "ck"
    shutil.copytree(out / "checkpoint", ckpt)
    path = ckpt / "iteration_00000006" / "common.json"
    info = json.loads(path.read_text())
    change(info["common"])
    path.write_text(json.dumps(info))
    raw = tiny_config(tmp_path / "run", tiny_corpus, training=ONE_GRAPH, checkpoint={"load_path": str(ckpt)})
    with pytest.raises(TrainerConfigError) as error:
        _trainer(raw)
    message = str(error.value)
    assert "\n" not in message and needle in message, message
    assert message.startswith("checkpoint.load_path: ") and ("common.json: " in message)


def test_only_rank_0_judges_the_files_a_run_writes_as_it_begins(tmp_path, monkeypatch, tiny_corpus, tiny_config):
    """Under a launch, rank 0 writes metrics.jsonl as the run begins; a slower rank inspecting the
    directory then must not take it for an earlier run's (it refused, and the launch failed)."""
    from mf_trainer.rundir import inspect_run

    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 0, "start": 1.0, "time": 1.0}\n')
    cfg = mf_config.load_config(tiny_config(out, tiny_corpus, checkpoint={"save_path": str(out / "checkpoint")}))
    monkeypatch.setenv("RANK_ID", "0")
    assert inspect_run(cfg).verdict == "leftovers"
    monkeypatch.setenv("RANK_ID", "1")
    assert inspect_run(cfg).verdict != "leftovers"
