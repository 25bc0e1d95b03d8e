"""`use_parallel`, `parallel_config`, `parallel` and the pipeline layer placement.

Degrees map one to one (model_parallel -> tensor_parallel, pipeline_stage -> pipeline_parallel);
data_parallel is not written: mf derives it from the devices launched (data_parallel_shard -1),
and the old value lives on in training.global_batch_size. MindFormers places
`num_layers // stages + offset[i]` layers on stage i (offset may be per interleaved chunk); mf takes
the resulting counts as `pipeline_parallel_layers_per_stage`.
"""

from __future__ import annotations

from typing import Any

from mf_config.errors import fmt_value
from mf_config.legacy.session import Migration
from mf_config.legacy.tables import PARALLEL, PARALLEL_CONFIG, PARALLEL_OPTIMIZER_CONFIG, lookup

PC = ("parallel_config",)
PAR = ("parallel",)
MC = ("model", "model_config")
_CP_METHODS = {"colossalai_cp": "colossal", "ulysses_cp": "ulysses", "hybrid_cp": "hybrid"}
_SCHEDULES = {"1f1b": "1f1b", "gpipe": "gpipe"}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def migrate_parallel(m: Migration) -> None:
    if m.value(("use_parallel",)) is False:
        why = "use_parallel is False: the old run used one device and MindFormers ignored it"
        for prefix in (PC, PAR):
            for key in m.src.mapping(prefix):
                m.unneeded((*prefix, key), why)
        m.translated(("use_parallel",), "one device: mf runs in parallel only when launched on several devices "
                                        "(`mf launch -n N`)")
    else:
        if m.src.has(("use_parallel",)):
            m.unneeded(("use_parallel",), "mf runs in parallel whenever it is launched on several devices "
                                          "(`mf launch -n N`)")
        _degrees(m)
        _parallel_context(m)
    _placement(m)


def _degree(m: Migration, key: str) -> int:
    value = m.value((*PC, key), 1)
    if _is_int(value) and value >= 1:
        return value
    m.dropped((*PC, key), f"must be a positive integer, got {fmt_value(value)}; 1 is used")
    return 1


def _degrees(m: Migration) -> None:
    pc = m.src.mapping(PC)
    f = m.facts
    f.tensor_parallel, f.pipeline_parallel = _degree(m, "model_parallel"), _degree(m, "pipeline_stage")
    cp, ep, f.data_parallel = _degree(m, "context_parallel"), _degree(m, "expert_parallel"), _degree(m, "data_parallel")
    for old, new, value in (("model_parallel", "tensor_parallel", f.tensor_parallel),
                            ("context_parallel", "context_parallel", cp),
                            ("pipeline_stage", "pipeline_parallel", f.pipeline_parallel),
                            ("expert_parallel", "expert_parallel", ep)):
        if old in pc and not m.src.is_handled((*PC, old)):
            m.copy((*PC, old), f"parallelism.{new}", value)
    if "data_parallel" in pc and not m.src.is_handled((*PC, "data_parallel")):
        devices = f.data_parallel * f.tensor_parallel * cp * f.pipeline_parallel
        m.translated((*PC, "data_parallel"),
                     f"parallelism.data_parallel_shard stays -1 (all remaining devices): launch {devices} devices "
                     f"(data {f.data_parallel} x tensor {f.tensor_parallel} x context {cp} x pipeline "
                     f"{f.pipeline_parallel}) for the old layout; it also sets training.global_batch_size")
    mbn = pc.get("micro_batch_num", 1)
    f.micro_batch_num = mbn if _is_int(mbn) and mbn >= 1 else 1
    _sequence_parallel(m, cp)
    _context_parallel_method(m, cp)
    m.drop_table(PC, PARALLEL_CONFIG)


def _sequence_parallel(m: Migration, cp: int) -> None:
    path = (*PC, "use_seq_parallel")
    if not m.src.has(path):
        return
    on, tp = m.value(path) is True, m.facts.tensor_parallel
    if on and tp > 1 and cp == 1:
        m.copy(path, "parallelism.sequence_parallel", True)
    elif on:
        m.unneeded(path, "MindFormers ignored it " + ("with context_parallel > 1" if cp > 1 else
                                                      "without model_parallel > 1"))
    elif tp > 1:
        m.dropped(path, "mf always uses sequence parallelism with tensor parallelism; it cannot be turned off")
    else:
        m.unneeded(path, "no tensor parallelism")


def _context_parallel_method(m: Migration, cp: int) -> None:
    algo_path, degree_path = (*PC, "context_parallel_algo"), (*PC, "ulysses_degree_in_cp")
    algo = m.value(algo_path)
    if algo is not None:
        if cp == 1:
            m.unneeded(algo_path, "no context parallelism (context_parallel is 1)")
        elif lookup(_CP_METHODS, algo):
            m.copy(algo_path, "parallelism.context_parallel_method", _CP_METHODS[algo])
        else:
            m.dropped(algo_path, f"unknown context-parallel method (mf has {', '.join(_CP_METHODS)} as colossal, "
                                 "ulysses, hybrid)")
    if m.src.has(degree_path):
        if cp > 1 and lookup(_CP_METHODS, algo) == "hybrid":
            m.copy(degree_path, "parallelism.ulysses_degree_in_cp")
        else:
            m.unneeded(degree_path, "used only with context_parallel_algo hybrid_cp")


def _parallel_context(m: Migration) -> None:
    par = m.src.mapping(PAR)
    mode_path = (*PAR, "parallel_mode")
    if mode_path[-1] in par:
        if par["parallel_mode"] == 2 or par["parallel_mode"] == "auto_parallel":
            m.dropped(mode_path, "automatic strategy search is not supported: the degrees of parallel_config are used")
        else:
            m.unneeded(mode_path, "mf's parallel layout comes from the parallelism section")
    sharded = par.get("enable_parallel_optimizer")
    if "enable_parallel_optimizer" in par:
        path = (*PAR, "enable_parallel_optimizer")
        if sharded is True:
            m.copy(path, "parallelism.data_parallel_shard_strategy", "optim_grads_params",
                   note="MindSpore's optimizer parallelism sharded weights and optimizer state over data parallel, "
                        "as FSDP (mf's default) does")
        else:
            m.copy(path, "parallelism.data_parallel_shard_strategy", "no_shard",
                   note="weights stay replicated over data parallel, as before (mf's default would shard them)")
    _shard_size(m, sharded is True)
    _pipeline_config(m)
    m.drop_table(PAR, PARALLEL)
    m.drop_table((*PAR, "parallel_optimizer_config"), PARALLEL_OPTIMIZER_CONFIG)


def _shard_size(m: Migration, sharded: bool) -> None:
    path = (*PAR, "parallel_optimizer_config", "optimizer_weight_shard_size")
    if not m.src.has(path):
        return
    size, dp = m.value(path), m.facts.data_parallel
    if not sharded:
        m.unneeded(path, "used only with enable_parallel_optimizer")
    elif not _is_int(size) or size <= 0 or size >= dp:
        m.unneeded(path, f"{fmt_value(size)} shards over the whole data-parallel group, as FSDP does")
    elif dp % size:
        m.dropped(path, f"{size} does not divide data_parallel {dp}")
    else:
        m.copy(path, "parallelism.data_parallel_shard", size,
               note=f"HSDP: weights sharded within groups of {size} devices, replicated across the groups")


def _pipeline_config(m: Migration) -> None:
    base = (*PAR, "pipeline_config")
    pipe = m.src.mapping(base)
    pp = m.facts.pipeline_parallel
    interleave_on = pipe.get("pipeline_interleave") is True and pp > 1
    if "pipeline_interleave" in pipe:
        m.line((*base, "pipeline_interleave"), "unneeded",
               "interleaving is parallelism.pipeline_parallel_interleave_num (from model_config.pp_interleave_num)"
               if interleave_on else "no interleaved pipeline")
    if "pipeline_scheduler" in pipe:
        path, schedule = (*base, "pipeline_scheduler"), pipe["pipeline_scheduler"]
        if pp == 1:
            m.unneeded(path, "no pipeline parallelism")
        elif lookup(_SCHEDULES, schedule):
            m.copy(path, "parallelism.pipeline_parallel_schedule", _SCHEDULES[schedule])
        else:
            m.dropped(path, f"the {schedule} schedule is not supported (mf has 1f1b, interleaved 1f1b and gpipe)")
    pin_path = (*MC, "pp_interleave_num")
    pin = m.value(pin_path)
    if pin is not None:
        if interleave_on and _is_int(pin) and pin >= 1:
            m.facts.interleave = pin
            m.copy(pin_path, "parallelism.pipeline_parallel_interleave_num", pin)
        else:
            m.unneeded(pin_path, "used only with parallel.pipeline_config.pipeline_interleave and pipeline_stage > 1")


# -- pipeline placement -------------------------------------------------------------------------------
def _stage_counts(m: Migration, offset: Any, total: int) -> list[list[int]] | None:
    """MindFormers' layer counts per (interleave chunk, stage), or None when `offset` does not fit."""
    pp, v = m.facts.pipeline_parallel, m.facts.interleave
    if _is_int(offset):
        grid = [[offset] * pp for _ in range(v)]
    elif isinstance(offset, list) and offset and all(_is_int(x) for x in offset) and len(offset) == pp:
        grid = [list(offset) for _ in range(v)]
    elif (isinstance(offset, list) and len(offset) == v
          and all(isinstance(row, list) and len(row) == pp and all(_is_int(x) for x in row) for row in offset)):
        grid = [list(row) for row in offset]
    else:
        return None
    base = total // (pp * v)
    counts = [[base + x for x in row] for row in grid]
    if sum(map(sum, counts)) != total or min(map(min, counts)) < 1:
        return None
    return counts


def _placement(m: Migration) -> None:
    f = m.facts
    offset_path, lps_path = (*MC, "offset"), (*MC, "layers_per_stage")
    offset, lps = m.value(offset_path, 0), m.value(lps_path)
    stages = f.pipeline_parallel * f.interleave
    if f.num_layers is None:
        for path in (offset_path, lps_path):
            if m.src.has(path):
                m.action(path, "the layer placement could not be translated without model num_layers: set "
                               "parallelism.pipeline_parallel_layers_per_stage by hand")
        return
    total = f.num_layers + f.mtp_depth
    if f.pipeline_parallel == 1:
        for path, value in ((offset_path, offset), (lps_path, lps)):
            if m.src.has(path):
                m.line(path, "unneeded" if value in (0, None) or value == [0] else "dropped", "no pipeline parallelism")
        f.stage_layers = [list(range(f.num_layers))]
        return
    source = lps_path if lps is not None else offset_path
    if lps is not None:
        ok = (f.interleave == 1 and isinstance(lps, list) and len(lps) == f.pipeline_parallel
              and all(_is_int(x) and x >= 1 for x in lps) and sum(lps) == total)
        counts = [list(lps)] if ok else None
        if m.src.has(offset_path):
            m.unneeded(offset_path, "layers_per_stage is given and is the one used")
    else:
        counts = _stage_counts(m, offset, total)
    if counts is None:
        flat = [total // stages] * stages if total % stages == 0 else None
        if m.src.has(source) and (offset not in (0, None) or lps is not None):
            m.dropped(source, f"{fmt_value(m.value(source))} does not place {total} layers on {stages} stages "
                              "(MindFormers would have refused it)")
    else:
        flat = [c for row in counts for c in row]
    if flat is not None and f.mtp_depth:
        flat[-1] -= f.mtp_depth  # MindFormers placed the MTP layers after the last decoder layer
        if flat[-1] < 1:
            m.action(source, "without its MTP layers the last pipeline stage would be empty: set "
                             "parallelism.pipeline_parallel_layers_per_stage by hand")
            return
    if flat is None:
        return
    f.stage_layers = _layer_ids(flat)
    if m.src.is_handled(source) or not m.src.has(source) and not f.mtp_depth:
        return
    if len(set(flat)) == 1:
        if m.src.has(source):
            m.unneeded(source, "an even split, mf's default")
        return
    m.set("parallelism.pipeline_parallel_layers_per_stage", flat)
    rule = ("layers per stage as given" if source == lps_path else
            f"layers per stage = {total} // {stages} + offset")
    mtp = f", minus the {f.mtp_depth} MTP layer(s) on the last stage" if f.mtp_depth else ""
    if m.src.has(source):
        m.translated(source, f"parallelism.pipeline_parallel_layers_per_stage: {flat} ({rule}{mtp})")
    else:
        m.line(MC, "translated", f"parallelism.pipeline_parallel_layers_per_stage: {flat} (an even split{mtp})",
               mark=False)


def _layer_ids(counts: list[int]) -> list[list[int]]:
    out, start = [], 0
    for n in counts:
        out.append(list(range(start, start + n)))
        start += n
    return out
