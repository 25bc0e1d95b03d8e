"""The `parallelism` section is resolved once (mf_parallel.Layout) and the Trainer's consumers take
that object: its defaults are the schema's, the preflight hands it on, and a knob the layout has
nothing to act on is one notice in every command that plans a run."""

from __future__ import annotations

import dataclasses

import mf_config
import mf_parallel as mp
import mf_trainer


def test_the_layout_defaults_are_the_schema_defaults():
    schema = {f.name: f.default for f in dataclasses.fields(mf_config.ParallelismConfig)}
    assert list(schema) == list(mp.FIELDS) and schema == dict(mp.FIELDS)
    assert mp.Layout.resolve(mf_config.ParallelismConfig(), 1).fields == mp.FIELDS


def test_the_preflight_resolves_the_layout_the_run_goes_on_with(tmp_path, tiny_config):
    cfg = mf_config.load_config(tiny_config(tmp_path, tmp_path / "none", parallelism={"tensor_parallel": 2}))
    report = mf_trainer.preflight(cfg, "launch", world=4, device="CPU")
    assert report.ok and report.layout.dims == mp.ParallelDims(4, dp_shard=2, tp=2) and report.layout.device == "CPU"
    assert mf_trainer.preflight(cfg, "launch", world=3, device="CPU").layout is None     # tp 2 does not fit 3 ranks
    assert mf_trainer.preflight(cfg, "eval", world=1).layout is None                     # one process: no layout


def test_a_pipeline_knob_without_stages_is_planned_as_its_default(tmp_path, tiny_config):
    """(The memory estimate resolved the schedule itself and raised here: one layout says it once.)"""
    cfg = mf_config.load_config(tiny_config(tmp_path, tmp_path / "none",
                                            parallelism={"pipeline_parallel_schedule": "zbv"}))
    plan = mf_trainer.dry_run(cfg, world=2, device="CPU")
    assert plan.layout.startswith("world=2") and plan.memory[0].startswith("memory per rank")
    notices = [line for line in plan.lines() if line.startswith("notice: parallelism.")]
    assert notices == ["notice: parallelism.pipeline_parallel_schedule: 'zbv' only acts with pipeline_parallel > 1: "
                       "nothing to act on in this layout"]
