"""The preflight: every problem at once, keyed; what it skips without a world or device; adding a
check is one function; it imports no MindSpore."""

from __future__ import annotations

import subprocess
import sys

import pytest

import mf_config
import mf_trainer
from mf_trainer.preflight import CHECKS, PreflightError, check


def _cfg(tmp_path, tiny_config, **sections):
    return mf_config.load_config(tiny_config(tmp_path, tmp_path / "none", **sections))


def test_every_independent_problem_is_one_keyed_line(tmp_path, tiny_config):
    cfg = _cfg(tmp_path, tiny_config, parallelism={"pipeline_parallel": 2, "data_parallel_shard_strategy": "optim"},
               model={"hidden_sizee": 8}, inference={"top_k": 3}, monitor={"train_state": {"local_norm": "wq("}})
    report = mf_trainer.preflight(cfg, "train", world=1, device="CPU")
    assert report.keys == ["inference.top_k", "parallelism.data_parallel_shard_strategy", "parallelism.pipeline_parallel",
                           "model.hidden_sizee", "monitor.train_state.local_norm"]
    with pytest.raises(PreflightError) as err:
        report.raise_for_problems()
    assert isinstance(err.value, mf_trainer.TrainerConfigError)
    assert str(err.value).splitlines() == report.lines() and err.value.problems == report.problems


def test_world_and_device_checks_are_skipped_and_named_without_them(tmp_path, tiny_config):
    cfg = _cfg(tmp_path, tiny_config, parallelism={"tensor_parallel": 2}, context={"device_id": 1})
    report = mf_trainer.preflight(cfg, "train")
    assert report.ok and any("world size" in s for s in report.skipped) and any("device" in s for s in report.skipped)
    assert mf_trainer.preflight(cfg, "train", world=1, device="CPU").keys == ["parallelism.tensor_parallel",
                                                                               "context.device_id"]
    assert mf_trainer.preflight(cfg, "launch", world=2, device="Ascend").ok


def test_model_and_layout_checks(tmp_path, tiny_config):
    # 4 heads (mf-config checks those against tp), 2 key/value heads, vocab 66: two independent lines
    model = {**tiny_config(tmp_path, tmp_path)["model"], "num_attention_heads": 4, "num_key_value_heads": 2,
             "vocab_size": 66}
    cfg = _cfg(tmp_path, tiny_config, parallelism={"tensor_parallel": 4}, model=model)
    lines = mf_trainer.preflight(cfg, "launch", world=4).lines()
    assert lines == ["parallelism.tensor_parallel: 4 does not divide model.num_key_value_heads = 2; use a "
                     "tensor_parallel that divides both head counts: one of [1, 2]",
                     "parallelism.tensor_parallel: 4 does not divide model.vocab_size = 66; use a tensor_parallel "
                     "that divides it (e.g. one of [1, 2, 3, 6, 11, 22, 33])"]
    assert mf_trainer.preflight(cfg, "launch", world=6).keys[0] == "parallelism"     # 4 does not divide 6


CP_REFUSED = [
    ({"context_parallel": 2, "context_parallel_method": "ulysses", "context_parallel_async": True}, {}, 2,
     "parallelism.context_parallel_async: true has nothing to overlap with context_parallel_method 'ulysses'"),
    ({"context_parallel": 4, "context_parallel_method": "ulysses"}, {}, 4,
     "parallelism.context_parallel: 4 does not divide the 2 attention heads a tensor-parallel rank holds; Ulysses "
     "splits heads over the cp ranks: use context_parallel one of [2] or context_parallel_method 'colossal'"),
    ({"context_parallel": 2}, {"seq_length": 30}, 2,
     "parallelism.context_parallel: a sequence of 30 tokens does not split into 2 x context_parallel = 4 equal "
     "chunks; use a seq_length divisible by 4"),
    ({"context_parallel": 2, "data_parallel_shard_strategy": "no_shard"}, {}, 2,
     "parallelism.data_parallel_shard_strategy: 'no_shard' with context_parallel > 1: the cp ranks' gradients are "
     "added by FSDP, which shards over dp_shard x cp; use 'optim_grads_params'"),
    ({"context_parallel": 2, "pipeline_parallel": 2}, {}, 4,
     "parallelism.context_parallel: 2 with pipeline_parallel 2 is not implemented (pipeline stages have no "
     "context-parallel attention); use one of them"),
    ({"context_parallel_method": "ulysses"}, {}, 2,
     "parallelism.context_parallel_method: 'ulysses' only acts with context_parallel > 1 (leave it at its default)"),
    ({"context_parallel": 2}, {}, 1,
     "parallelism.context_parallel: 2 > 1 needs 2 ranks; this process runs alone: start it with `mf launch -n N` "
     "(N a multiple of 2)"),
]


@pytest.mark.parametrize("parallelism, sections, world, line", CP_REFUSED)
def test_context_parallel_refusals_are_one_keyed_line(tmp_path, tiny_config, parallelism, sections, world, line):
    sections = dict(sections)
    raw = tiny_config(tmp_path, tmp_path / "none", parallelism=parallelism, **sections)
    if "seq_length" in sections:
        raw["train_dataset"]["dataloader"]["config"]["seq_length"] = raw.pop("seq_length")
    lines = mf_trainer.preflight(mf_config.load_config(raw), "train" if world == 1 else "launch", world=world).lines()
    assert any(got.startswith(line) for got in lines), lines


@pytest.mark.parametrize("parallelism, world", [
    ({"context_parallel": 2}, 2), ({"context_parallel": 2, "context_parallel_method": "ulysses"}, 4),
    ({"context_parallel": 4, "context_parallel_method": "hybrid", "ulysses_degree_in_cp": 2,
      "context_parallel_async": True}, 4),
    ({"context_parallel": 2, "tensor_parallel": 2, "context_parallel_async": True}, 4),
])
def test_context_parallel_layouts_that_run(tmp_path, tiny_config, parallelism, world):
    cfg = _cfg(tmp_path, tiny_config, parallelism=parallelism)
    report = mf_trainer.preflight(cfg, "launch", world=world, device="CPU")
    assert report.ok, report.lines()


@pytest.mark.parametrize("parallelism, world, training", [
    ({"tensor_parallel": 2}, 2, {}), ({"context_parallel": 2}, 2, {}),
    ({"context_parallel": 2, "tensor_parallel": 2}, 4, {}),
    ({"pipeline_parallel": 2}, 2, {"local_batch_size": 1}),
    ({"data_parallel_shard": 2, "tensor_parallel": 2}, 4, {}),
])
def test_evaluation_during_training_runs_under_every_layout(tmp_path, tiny_config, parallelism, world, training):
    """eval_dataset with tp (vocab-parallel loss and argmax), cp (each rank's chunks, sums over cp)
    and pp (forward-only through the stages): nothing refused (the dist launch proves the numbers)."""
    raw = tiny_config(tmp_path, tmp_path / "none", parallelism=parallelism, training=training)
    raw["eval_dataset"] = {"dataloader": dict(raw["train_dataset"]["dataloader"], sizes=[0, 50, 0]),
                           "eval_interval": 2, "eval_iters": 2}
    report = mf_trainer.preflight(mf_config.load_config(raw), "launch", world=world, device="CPU")
    assert report.ok, report.lines()


def test_compressed_eod_mask_acts_under_context_parallelism_only(tmp_path, tiny_config):
    """Packed documents as actual_seq_len: under cp the ring / Ulysses attention takes them as
    document ids; one cp rank has no variable-length kernel (one keyed line)."""
    def cfg(cp):
        raw = tiny_config(tmp_path, tmp_path / "none", parallelism={"context_parallel": cp})
        dl = raw["train_dataset"]["dataloader"]
        dl["config"].update(create_compressed_eod_mask=True, reset_attention_mask=True)
        dl["column_names"] = [*dl["column_names"], "actual_seq_len"]
        return mf_config.load_config(raw)

    assert mf_trainer.preflight(cfg(2), "launch", world=2, device="CPU").ok
    lines = mf_trainer.preflight(cfg(1), "train", world=1, device="CPU").lines()
    assert lines == ["train_dataset.dataloader.config.create_compressed_eod_mask: the compressed EOD mask needs a "
                     "variable-length attention kernel that mf-models does not have; it acts under "
                     "parallelism.context_parallel > 1 (document ids in the cp attention), else use "
                     "create_attention_mask with reset_attention_mask"]


def test_run_mode_that_the_command_does_not_run_is_the_only_line(tmp_path, tiny_config):
    cfg = _cfg(tmp_path, tiny_config, run_mode="predict", inference={"prompts": ["x"]},
               tokenizer={"path": "t.model"}, checkpoint={"load_path": "w"})
    assert mf_trainer.preflight(cfg, "train", world=1, source="p.yaml").lines() == [
        "run_mode: 'predict' is not a training mode: run `mf generate p.yaml`"]
    assert mf_trainer.preflight(cfg, "generate", world=1).ok


def test_adding_a_check_is_one_function(tmp_path, tiny_config):
    @check(needs=("world",))
    def steps_per_rank(t):
        """At least one step per rank (a made-up rule)."""
        if t.cfg.training.steps < t.world:
            yield "training.steps", f"{t.cfg.training.steps} < {t.world} ranks"

    try:
        cfg = _cfg(tmp_path, tiny_config)
        assert mf_trainer.preflight(cfg, "launch", world=8).lines()[-1] == "training.steps: 6 < 8 ranks"
        assert mf_trainer.preflight(cfg, "launch", world=2).ok
        assert "At least one step per rank (a made-up rule) (needs the world size: --world N)" in \
            mf_trainer.preflight(cfg, "train").skipped
    finally:
        CHECKS.pop()


def test_the_preflight_imports_no_mindspore():
    code = ("import sys, mf_trainer, mf_models\n"
            "assert not any(m.split('.')[0] == 'mindspore' for m in sys.modules), 'mindspore imported'\n"
            "print('clean')")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "clean", run.stderr


def test_muon_keys_and_layouts(tmp_path, tiny_config):
    """Muon's pass-through keys are checked without MindSpore; FSDP passes, tensor parallelism is refused."""
    ok = _cfg(tmp_path, tiny_config, optimizer={"type": "Muon", "momentum": 0.9, "adamw_params": ["wo"]})
    assert mf_trainer.preflight(ok, "launch", world=2).ok
    bad = _cfg(tmp_path, tiny_config, optimizer={"type": "Muon", "ns_steps": 0}, parallelism={"tensor_parallel": 2})
    assert mf_trainer.preflight(bad, "launch", world=2).lines() == [
        "optimizer.ns_steps: must be between 1 and 20, got 0",
        "optimizer.type: Muon with parallelism.tensor_parallel 2 is not implemented (Newton-Schulz needs each matrix "
        "whole; only FSDP/HSDP shards are gathered); use tensor_parallel: 1 or type: AdamW"]
