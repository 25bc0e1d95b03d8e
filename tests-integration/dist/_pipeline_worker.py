"""Pipeline parallelism on CPU ranks: any schedule against one process, one case after another in
one msrun launch (the session runs the split-backward ones in one 2-rank launch, see
test_pipeline_parity.py; the other cases stay runnable by hand and for benchmarks).

Usage: _pipeline_worker.py CASE [CASE ...]   (see CASES)

Per case, on every rank: mf-models' tiny llama (tied embeddings, attention biases, fp32) is built
from one seed; the reference is that whole model in this process, differentiated per micro-batch
with MindSpore's autodiff and summed (what one process training on the same global batch
computes). The pipeline run splits an identical copy with mf-models' `pipeline_stage` and runs the
case's schedule through mf-parallel's executor. Two steps, with the same plain SGD update applied
to both after each (so the tied copies must have stayed equal). Rank 0 computes the reference once
per model of the launch (timed while the others wait) and broadcasts it. Each rank reports, as
RESULT lines: the loss and every local parameter's gradient against the reference (by global
name), and its measured times next to what the simulator predicts for the costs measured in it.
"""

from __future__ import annotations

import logging
import sys
import time

import mindspore as ms
import numpy as np
from _results import emit, run_check
from mindspore import Tensor, ops

import mf_config
import mf_models
import mf_parallel as mp

ms.set_context(mode=ms.PYNATIVE_MODE, pynative_synchronize=True)

records: list[str] = []


class _Capture(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())


logging.getLogger("mf_parallel").addHandler(_Capture())
logging.getLogger("mf_parallel").setLevel(logging.INFO)

RTOL = 1e-5
LR = 0.5
BATCH, SEQ, VOCAB = 2, 8, 64

# name -> (pipeline_parallel, schedule, interleave_num, layers, layers_per_stage, micro-batches, flags)
CASES = {
    "pp2_gpipe": (2, "gpipe", 1, 4, None, 4, {}),
    "pp2_1f1b": (2, "1f1b", 1, 4, None, 4, {}),
    "pp2_interleaved": (2, "1f1b", 2, 4, None, 4, {}),
    "pp2_1f1b_split": (2, "1f1b", 1, 4, None, 4, {"dxdw_split": True}),
    "pp2_zbv": (2, "zbv", 1, 4, None, 4, {}),
    "pp2_interleaved_split_overlap": (2, "1f1b", 2, 4, None, 4,
                                      {"dxdw_split": True, "overlap_p2p": True, "overlap_b_f": True}),
    # Plain 1F1B with overlap_b_f: each steady-state backward runs with the next forward as one
    # action (HyperParallel's OVERLAP_B_F) after a 2(pp - 1 - r) warm-up.
    "pp2_1f1b_overlap_b_f": (2, "1f1b", 1, 4, None, 4, {"overlap_b_f": True}),
    "pp4_1f1b_uneven": (4, "1f1b", 1, 6, [1, 2, 2, 1], 4, {}),
    "pp4_zbv": (4, "zbv", 1, 8, None, 8, {}),
}

# Cases whose results must be bit for bit those of another schedule (the same per-stage backward
# order, only forwards moved): overlap_b_f changes when computations run, never what they compute.
IDENTICAL_TO = {"pp2_1f1b_overlap_b_f": "pp2_1f1b"}

MODEL = {"model_type": "llama", "vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32,
         "tie_word_embeddings": True, "attention_bias": True}
_LOG_SOFTMAX = ops.LogSoftmax(-1)


def micro_batches(m: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(m):
        ids = rng.integers(0, VOCAB, (BATCH, SEQ)).astype(np.int32)
        out.append({"input_ids": Tensor(ids), "labels": Tensor(np.roll(ids, -1, axis=1)),
                    "loss_mask": Tensor((rng.random((BATCH, SEQ)) > 0.25).astype(np.float32))})
    return out


def make_loss_fn(mbs):
    """Masked token loss over the global token count (the Trainer's loss)."""
    inv_tokens = 1.0 / sum(float(mb["loss_mask"].asnumpy().sum()) for mb in mbs)

    def loss_fn(logits, mb):
        per_token = -ops.gather_elements(_LOG_SOFTMAX(logits.reshape(-1, VOCAB)), 1,
                                         mb["labels"].reshape(-1, 1)).reshape(-1)
        return (per_token * mb["loss_mask"].reshape(-1)).sum() * inv_tokens

    return loss_fn


def reference_step(model, mbs, loss_fn):
    """One process, the whole model, per micro-batch autodiff summed: (loss, {name: grad})."""
    params = model.trainable_params()
    total, grads = 0.0, None
    for mb in mbs:
        out, vjp_fn = ms.vjp(lambda mb=mb: loss_fn(model(mb["input_ids"]), mb), weights=params)
        _, g = vjp_fn(ops.ones_like(out))
        total += float(out.asnumpy())
        grads = list(g) if grads is None else [a + b for a, b in zip(grads, g)]
    return total, {p.name: x.asnumpy() for p, x in zip(params, grads)}


_REFERENCES: dict[tuple, tuple] = {}


def reference(layers: int, m: int, world_group) -> list[tuple]:
    """The one-process run (2 steps with SGD between) for `layers` and `m` micro-batches: rank 0
    computes it, timed while the other ranks wait, and broadcasts it; cached for every case of the
    launch with that model. [(loss, {name: grad}, mbs), ...] and the seconds per step."""
    key = (layers, m)
    if key in _REFERENCES:
        return _REFERENCES[key]
    model = mf_models.build_model({**MODEL, "num_hidden_layers": layers}, seed=0)
    params = model.trainable_params()
    steps, seconds = [], 0.0
    for step in range(2):
        mbs = micro_batches(m, seed=100 * step + 7)
        loss_fn = make_loss_fn(mbs)
        mp.barrier(world_group)
        if world_group.rank == 0:
            t0 = time.perf_counter()
            loss, grads = reference_step(model, mbs, loss_fn)
            seconds += time.perf_counter() - t0
            flat = np.concatenate([[loss]] + [grads[p.name].reshape(-1) for p in params]).astype(np.float32)
        else:
            flat = np.zeros(1 + sum(int(np.prod(p.shape)) for p in params), np.float32)
        flat = mp.broadcast(Tensor(flat), world_group, 0).asnumpy()
        loss, pos, grads = float(flat[0]), 1, {}
        for p in params:
            size = int(np.prod(p.shape))
            grads[p.name] = flat[pos:pos + size].reshape(p.shape)
            pos += size
        steps.append((loss, grads, mbs, loss_fn))
        sgd(params, [grads[p.name] for p in params])
    table = model.tok_embeddings.weight.asnumpy()
    _REFERENCES[key] = (steps, seconds / 2, table)
    return _REFERENCES[key]


def sgd(params, grads) -> None:
    for p, g in zip(params, grads):
        p.set_data(p - LR * (g if isinstance(g, Tensor) else Tensor(g)))


def measured_stage_costs(result: mp.StepResult, schedule, world_group) -> dict[int, mp.Costs]:
    """Every virtual stage's mean F, B, W seconds in this step (each rank measures its own)."""
    table = np.zeros((schedule.pp * schedule.chunks, 3), np.float32)
    for stage, c in result.stage_costs().items():
        table[stage] = (c.F, c.B, c.W)
    table = mp.all_reduce(Tensor(table), world_group).asnumpy()
    return {v: mp.Costs(*(float(max(x, 1e-9)) for x in table[v])) for v in range(len(table))}


def build_executor(name: str, mesh, rank: int):
    """(spec, layout, schedule, stage, executor) of case `name` on a fresh copy of its model."""
    pp, schedule_name, interleave, layers, per_stage, m, flags = CASES[name]
    spec = mp.resolve_pipeline(pp, schedule_name, interleave, **flags)
    placement = mf_config.pipeline_layer_placement(per_stage, pp, interleave, layers, schedule=spec.schedule)
    layout = mp.StageLayout.build(spec, placement)
    schedule = mp.build_schedule(spec, m)
    mp.validate_schedule(schedule)
    piped = mf_models.build_model({**MODEL, "num_hidden_layers": layers}, seed=0)
    stage = mf_models.pipeline_stage(piped, layout, rank)
    executor = mp.PipelineExecutor(schedule, stage.chunks, mesh["pp"], tied=stage.tied, tied_ranks=layout.tied_ranks,
                                   overlap_p2p=spec.overlap_p2p)
    return spec, layout, schedule, stage, executor


def check_identical(name: str, mesh, rank: int, ref_steps, got: list) -> None:
    """The schedule IDENTICAL_TO names, on a fresh model over the same micro-batches: the same
    losses and gradients as `got` ([(loss, [grad arrays])] per step), bit for bit."""
    other = IDENTICAL_TO[name]
    _, _, _, _, executor = build_executor(other, mesh, rank)
    same, worst = True, 0.0
    for (_, _, mbs, loss_fn), (loss, grads) in zip(ref_steps, got):
        mp.barrier(mesh["world"])
        result = executor.step(mbs, loss_fn)
        same &= result.loss == loss
        for a, b in zip(result.grads, grads):
            a = a.asnumpy()
            same &= bool(np.array_equal(a, b))
            worst = max(worst, float(np.max(np.abs(a - b))))
        sgd(executor.params, result.grads)
    emit(f"pp_identical[{name}]", same, f"{name} against {other}: largest difference {worst:.1e}", worst=worst)


def run_case(name: str, mesh, rank: int) -> None:
    layers, m = CASES[name][3], CASES[name][5]
    spec, layout, schedule, stage, executor = build_executor(name, mesh, rank)
    ref_steps, ref_seconds, ref_table = reference(layers, m, mesh["world"])
    names = [p.name for p in executor.params]
    assert sorted(names) == sorted(n for n, _ in stage.parameters_and_names()), "executor params != stage params"
    errors, losses, seconds, result, got = [], [], 0.0, None, []
    for ref_loss, ref_grads, mbs, loss_fn in ref_steps:
        mp.barrier(mesh["world"])
        t0 = time.perf_counter()
        result = executor.step(mbs, loss_fn)
        seconds += time.perf_counter() - t0
        got.append((result.loss, [g.asnumpy() for g in result.grads]))
        losses.append((result.loss, ref_loss))
        errors.append(abs(result.loss - ref_loss) / abs(ref_loss))
        for pname, g in zip(names, result.grads):
            want = ref_grads[pname]
            scale = float(np.max(np.abs(want))) or 1.0
            errors.append(float(np.max(np.abs(g.asnumpy() - want))) / scale)
        sgd(executor.params, result.grads)
    worst = max(errors)
    tied_equal = all(float(np.max(np.abs(p.asnumpy() - ref_table))) <= 1e-6 for p in stage.tied)
    emit(f"pp[{name}]", worst <= RTOL and tied_equal,
         f"worst relative error {worst:.2e} over the loss and {len(names)} gradients, losses {losses}, tied copies "
         f"equal to the one-process table after two SGD steps: {tied_equal}",
         worst=worst, params=names, losses=losses, tied=len(stage.tied))
    if name in IDENTICAL_TO:
        check_identical(name, mesh, rank, ref_steps, got)
    # Timing of the second step: measured per rank vs the simulator for the costs measured in it.
    costs = measured_stage_costs(result, schedule, mesh["world"])
    sims = {mode: mp.simulate_schedule(schedule, p2p=mode, stage_costs=costs) for mode in ("async", "rendezvous")}
    emit(f"pp_time[{name}]", True, "", step_seconds=seconds / 2, one_process_seconds=ref_seconds,
         compute=result.compute_seconds, comm=result.comm_seconds, span=result.span_seconds,
         idle=result.idle_seconds, costs={v: [c.F, c.B, c.W] for v, c in costs.items()},
         sim_idle={mode: float(s.ranks[rank].idle) for mode, s in sims.items()},
         sim_span={mode: float(s.ranks[rank].span) for mode, s in sims.items()},
         recomputed=schedule.microbatches * schedule.chunks - len(executor.keep_tape))


def check_flag_logs(name: str):
    """On CPU each overlap flag says once what it changes and what it cannot change."""
    p2p = [m for m in records if m.startswith("pipeline_parallel_overlap_p2p on mccl")]
    bf = [m for m in records if m.startswith("pipeline_parallel_overlap_b_f on mccl")]
    ok = len(p2p) == 1 and "changes nothing here" in p2p[0] and len(bf) == 1 and "cannot change here" in bf[0]
    return ok, f"{p2p} {bf}"


def main(cases: list[str]) -> None:
    rank, world = mp.init_distributed()
    dims = mp.ParallelDims(world, pp=world)
    mesh = mp.init_mesh(dims)
    for name in cases:
        if CASES[name][0] != world:
            raise SystemExit(f"case {name} needs {CASES[name][0]} ranks, launched with {world}")
        run_case(name, mesh, rank)      # raising ends the launch: the peers would wait forever
    if any(CASES[c][6].get("overlap_b_f") for c in cases):
        run_check("pp_flags_logged", check_flag_logs, "")
    emit("done", True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s", stream=sys.stdout)
    main(sys.argv[1:])
