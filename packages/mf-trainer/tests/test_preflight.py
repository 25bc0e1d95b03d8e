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
               model={"hidden_sizee": 8}, inference={"prompts": ["hi"]}, monitor={"train_state": {"local_norm": "wq("}})
    report = mf_trainer.preflight(cfg, "train", world=1, device="CPU")
    assert report.keys == ["tokenizer.path", "parallelism.data_parallel_shard_strategy", "parallelism.pipeline_parallel",
                           "model.hidden_sizee", "monitor.train_state.local_norm"]
    with pytest.raises(PreflightError) as err:
        report.raise_for_problems()
    assert isinstance(err.value, mf_trainer.TrainerConfigError)
    assert str(err.value).splitlines() == report.lines() and err.value.problems == report.problems


def test_world_and_device_checks_are_skipped_and_named_without_them(tmp_path, tiny_config):
    cfg = _cfg(tmp_path, tiny_config, parallelism={"tensor_parallel": 2}, context={"device_id": 1})
    report = mf_trainer.preflight(cfg, "train")
    assert report.ok and any("world size" in s for s in report.skipped) and any("device" in s for s in report.skipped)
    report = mf_trainer.preflight(cfg, "train", world=1, device="CPU")
    assert report.keys == ["parallelism.tensor_parallel"] and [n.key for n in report.notices] == ["context.device_id"]
    assert mf_trainer.preflight(cfg, "launch", world=2, device="Ascend").ok


# The one policy: a speed, memory or telemetry knob with nothing to act on in this device or layout is
# accepted with exactly one notice line naming it and why. (command, world, device, sections, line)
NOTICED = [
    ("train", 1, "CPU", {"parallelism": {"pipeline_parallel_overlap_p2p": True}},
     "parallelism.pipeline_parallel_overlap_p2p: True only acts with pipeline_parallel > 1"),
    ("train", 1, "CPU", {"parallelism": {"pipeline_parallel_overlap_b_f": True}},
     "parallelism.pipeline_parallel_overlap_b_f: True only acts with pipeline_parallel > 1"),
    ("train", 1, "CPU", {"parallelism": {"pipeline_parallel_enable_dxdw_split": True}},
     "parallelism.pipeline_parallel_enable_dxdw_split: True only acts with pipeline_parallel > 1"),
    ("train", 1, "CPU", {"parallelism": {"pipeline_parallel_interleave_num": 2}},
     "parallelism.pipeline_parallel_interleave_num: 2 only acts with pipeline_parallel > 1"),
    ("train", 1, "CPU", {"parallelism": {"pipeline_parallel_schedule": "zbv"}},
     "parallelism.pipeline_parallel_schedule: 'zbv' only acts with pipeline_parallel > 1"),
    ("train", 1, "CPU", {"parallelism": {"context_parallel_async": True}},
     "parallelism.context_parallel_async: True only acts with context_parallel > 1"),
    ("train", 1, "CPU", {"parallelism": {"context_parallel_method": "ulysses"}},
     "parallelism.context_parallel_method: 'ulysses' only acts with context_parallel > 1"),
    ("launch", 2, "CPU", {"parallelism": {"context_parallel": 2, "context_parallel_method": "ulysses",
                                          "context_parallel_async": True}},
     "parallelism.context_parallel_async: true has nothing to overlap with context_parallel_method 'ulysses'"),
    ("launch", 2, "CPU", {"parallelism": {"context_parallel": 2, "context_parallel_async": True}},
     "parallelism.context_parallel_async: collectives are synchronous on device_target CPU"),
    ("launch", 2, "CPU", {"parallelism": {"context_parallel": 2, "ulysses_degree_in_cp": 2}},
     "parallelism.ulysses_degree_in_cp: 2: context_parallel_method 'colossal' is a pure ring"),
    ("train", 1, "CPU", {"parallelism": {"cpu_offload": True}},
     "parallelism.cpu_offload: parameters and optimizer states already live in host memory"),
    ("train", 1, "CPU", {"parallelism": {"reshard_after_forward_policy": "always"}},
     "parallelism.reshard_after_forward_policy: 'always' only acts with data parallelism over several ranks"),
    ("launch", 2, "CPU", {"parallelism": {"tensor_parallel": 2, "disable_gradient_division": False}},
     "parallelism.disable_gradient_division: False only acts with data parallelism"),
    ("train", 1, "CPU", {"parallelism": {"sequence_parallel": True}},
     "parallelism.sequence_parallel: true: sequence parallelism follows tensor_parallel, which is 1"),
    ("train", 1, "CPU", {"recompute_comm": {"enable": True, "select_module": {"attention": ["0"]}}},
     "recompute_comm.enable: recomputes communication operators; a single-process run has none"),
    ("train", 1, "CPU", {"profiler": {"start_step": 2, "end_step": 3}},
     "profiler.start_step: set while profiler.enable_profiling is false"),
    ("train", 1, "CPU", {"profiler": {"enable_profiling": True, "start_step": 2, "end_step": 60}},
     "profiler.end_step: 60 is after the last step (6): the profile ends there"),
    ("train", 1, "CPU", {"profiler": {"enable_profiling": True, "start_step": 7, "end_step": 9}},
     "profiler.start_step: 7 is after the last step (6): nothing is profiled"),
    ("train", 1, "CPU", {"profiler": {"enable_profiling": True, "profiler_level": 1}},
     "profiler.profiler_level: 1: the detail levels select Ascend kernel and AI Core data"),
    ("train", 1, "CPU", {"profiler": {"enable_profiling": True, "mstx": True}},
     "profiler.mstx: True: the mstx markers are recorded by the Ascend toolkit"),
    ("train", 1, "CPU", {"profiler": {"enable_profiling": True}},
     "profiler.with_stack: True: call stacks are collected with Ascend activity"),
    ("train", 1, "CPU", {"profiler": {"enable_profiling": True, "profile_cpu": False}},
     "profiler.profile_cpu: false: on device_target CPU the CPU activity is all there is"),
    ("train", 1, "CPU", {"optimizer": {"weight_decay_exclude": ["bias", "norm"]}},
     "optimizer.weight_decay_exclude: pattern 'bias' matches no parameter of this model"),
    ("train", 1, "CPU", {"inference": {"batch_size": 4}},
     "inference.batch_size: set without inference.prompts or input_file"),
    ("train", 1, "CPU", {"context": {"device_id": 3}}, "context.device_id: 3: a CPU run has no device index"),
    ("eval", 1, "CPU", {"run_mode": "eval", "checkpoint": {"load_path": "w"}, "parallelism": {"tensor_parallel": 2},
                        "eval_dataset": {"dataloader": {"type": "BlendedMegatronDatasetDataLoader", "sizes": [0, 9, 0],
                                                        "column_names": ["input_ids", "labels", "loss_mask"]}}},
     "parallelism.tensor_parallel: 2: this command runs in one process, so the layout has nothing to act on"),
]


@pytest.mark.parametrize("command, world, device, sections, line", NOTICED, ids=[c[4].split(":")[0] for c in NOTICED])
def test_knobs_with_nothing_to_act_on_are_notices(tmp_path, tiny_config, command, world, device, sections, line):
    report = mf_trainer.preflight(_cfg(tmp_path, tiny_config, **sections), command, world, device)
    assert report.ok, report.lines()
    said = [n for n in report.notice_lines() if n.startswith("notice: " + line.split(":")[0] + ":")]
    assert len(said) == 1 and said[0].startswith("notice: " + line), report.notice_lines()


@pytest.mark.parametrize("sections, line", [
    ({"parallelism": {"cpu_offload": True}}, "parallelism.cpu_offload: not supported by mf-parallel on Ascend yet"),
    ({"optimizer": {"weight_decay_exclude": ["bais", "nrom"]}},
     "optimizer.weight_decay_exclude: no pattern of ['bais', 'nrom'] matches a parameter of this model"),
])
def test_what_cannot_act_anywhere_stays_refused(tmp_path, tiny_config, sections, line):
    lines = mf_trainer.preflight(_cfg(tmp_path, tiny_config, **sections), "train", 1, "Ascend").lines()
    assert [got for got in lines if got.startswith(line)], lines


def test_an_eval_interval_past_the_run_evaluates_at_its_end(tmp_path, tiny_config):
    raw = tiny_config(tmp_path, tmp_path / "none")
    raw["eval_dataset"] = {"dataloader": dict(raw["train_dataset"]["dataloader"], sizes=[0, 50, 0]),
                           "eval_interval": 100, "eval_iters": 1}
    report = mf_trainer.preflight(mf_config.load_config(raw), "train", 1, "CPU")
    assert report.ok and report.notices == [], report.lines() + report.notice_lines()


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
