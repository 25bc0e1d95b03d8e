"""Per-rank memory of a training layout, from the YAML alone (no MindSpore, no model built).

    layout = mf_parallel.Layout.resolve(cfg.parallelism, world=4, device="CPU")   # or the preflight's
    plan = mf_trainer.memory_plan(cfg, layout)
    for rank in plan.ranks: print(rank.pp_rank, rank.total)
    print("\\n".join(plan.lines()))

For every pipeline rank (the other axes hold the same bytes on each of their ranks):

- parameters: the model's parameters (`mf_models.parameter_inventory`, the names and shapes
  `build_model` makes) cut the way the Trainer cuts them: tensor parallelism along the axis of
  the model's plan, then FSDP's dim-0 shard of the TP-local tensor over dp_shard x cp, padded to a
  multiple of the shard count (mf-parallel's FSDPShard: ceil(rows / shards) rows each). Pipeline
  ranks hold the layers of their chunks, the embedding on the first stage and the final norm and
  output projection on the last (a tied table on both). Under expert parallelism each rank
  keeps E / ep of the stacked experts, FSDP-sharded over the shards / ep ranks holding the same
  ones, and a MoE layer's activations are the all-to-all dispatcher's (`moe_activations` with
  expert_parallel: the local experts run on ep x the rank's assignments).
- gradients: one float32 buffer per stored parameter when the step accumulates micro-batches
  (`make_buffers`); a single micro-batch's gradients, parameter-sized, otherwise.
- optimizer: AdamW's exp_avg and exp_avg_sq, float32, shaped like the stored parameter.
- activations: `mf_models.saved_activations` per layer and for the head, times local_batch_size
  (a MoE layer's `mf_models.moe_activations` for the micro-batch's tokens at once),
  in the compute dtype (float32 on CPU, which has no bfloat16 kernels); recompute (full or a
  layer's top-level module) keeps only the recomputed cell's input, which its norm already holds;
  recompute_comm (tp > 1) keeps a selected module's input as the norm's sequence shard instead of
  its all-gathered full sequence (the projections gather it again in backward): (seq - seq/tp) x
  hidden fewer elements per sample and selected gather, rebuilt one at a time in backward.
  swap (not on CPU, where the host is the device) moves a swapped layer's or module's kept
  activations to host memory (a recomputed layer's: its input), leaving one swapped unit's on the
  device at a time (transient, below). Multiplied by the micro-batches a rank holds at once: 1
  without a pipeline (each micro-batch's backward runs before the next forward), the schedule's
  peak in flight with one.
- transient: what exists only around the peak. At the end of the forward on the last stage, the
  loss fused with the output projection (mf_parallel.LinearCrossEntropy) holds three float32
  logits-sized buffers of one chunk (its logits, their log-softmax, softmax - onehot; chunks of at
  most 32 MiB of logits) and the head's weight gradient [V/tp, H] it makes in the forward; at the
  start of the last backward, half a layer's worth of activation gradients (backward makes a
  gradient for each saved tensor of the layer it is in and frees the tensor and its gradient as
  it goes: about half of them exist at once, on average), one recomputed
  layer (or module) rebuilt in backward and one swapped unit back on the device. The larger of
  the two is taken: they do not exist at once. (Until mf-models 0.9.0 the measured peaks sat above
  the larger, and the sum was taken: MindSpore's CPU kernels for a broadcasting Add/Sub/RealDiv
  kept ~4x their output of their own, which mf-models now avoids; tests-integration/memory, full
  recompute: 328 MiB measured then, 209 now, 212 estimated; none 518 / 488, select 282 / 273,
  the small DeepSeek-V3 634 / 618.)
  Plus FSDP's gathered unit: one
  block's full TP-local parameters and its full gradient before the reduce-scatter (every
  gathered parameter when reshard_after_forward keeps them; mf-parallel emulates reduce-scatter
  with all-reduce on CPU, so the full gradient exists there too).

What is not counted: the framework itself (MindSpore's runtime, kernels, compile caches; measured
separately as an idle rank's baseline), the data loader, and the RoPE tables (a few KB).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import mf_config
import mf_models
import mf_parallel as mp
from mf_trainer.errors import TrainerConfigError
from mf_trainer.preflight.data import accumulation
from mf_trainer.preflight.registry import model_section

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
LAYER = re.compile(r"^layers\.(\d+)\.")
MODULES = ("attention_norm", "attention", "ffn_norm", "feed_forward", "moe")
# FSDP units that keep their gathered parameters from forward to backward (the models'
# `moe_units`: the router and the stacked experts have no reshard-after-forward).
KEPT_GATHERED = re.compile(r"\.moe\.(router|experts)\.")
# The stacked expert weights expert parallelism splits (mf_models' expert_plan).
EXPERT_WEIGHT = re.compile(r"\.moe\.experts\.w[123]$")


# Float32 buffers of a logits chunk alive at once in the fused loss's forward (see the transient below).
LOSS_BUFFERS = 3


@dataclass
class RankMemory:
    """Bytes on one rank of pipeline stage `pp_rank` (every tp / dp / cp rank of it alike)."""

    pp_rank: int
    layers: tuple[int, ...]
    parameters: int = 0
    gradients: int = 0
    optimizer: int = 0
    activations_per_microbatch: int = 0
    in_flight: int = 1
    transient: int = 0
    fsdp_gathered: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def activations(self) -> int:
        return self.activations_per_microbatch * self.in_flight

    @property
    def total(self) -> int:
        return (self.parameters + self.gradients + self.optimizer + self.activations + self.transient
                + self.fsdp_gathered)


@dataclass
class MemoryPlan:
    layout: str
    ranks: list[RankMemory]
    notes: list[str] = field(default_factory=list)

    @property
    def peak(self) -> int:
        return max(r.total for r in self.ranks)

    def lines(self, device_memory: int | None = None) -> list[str]:
        out = [f"memory per rank ({self.layout}):"]
        head = f"  {'stage':<8}{'params':>10}{'grads':>10}{'optim':>10}{'activ':>10}{'in flight':>10}" \
               f"{'transient':>10}{'fsdp':>10}{'total':>10}"
        out.append(head)
        for r in self.ranks:
            out.append(f"  {r.pp_rank:<8}{fmt_bytes(r.parameters):>10}{fmt_bytes(r.gradients):>10}"
                       f"{fmt_bytes(r.optimizer):>10}{fmt_bytes(r.activations):>10}{r.in_flight:>10}"
                       f"{fmt_bytes(r.transient):>10}{fmt_bytes(r.fsdp_gathered):>10}{fmt_bytes(r.total):>10}")
        if device_memory is not None:
            verdict = "fits" if self.peak <= device_memory else "does not fit"
            out.append(f"  peak {fmt_bytes(self.peak)} {verdict} in {fmt_bytes(device_memory)} per device")
        out += [f"  note: {n}" for n in self.notes]
        return out


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return f"{int(n)}B"


def parse_bytes(text: str, key: str = "--device-memory") -> int:
    """'64GB', '64GiB', '512MB', '1e9' -> bytes (GB and GiB both mean 2**30: device vendors' usage)."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([KMGT]i?B?)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise TrainerConfigError(f"{key}: expected a size like 64GB or 512MiB, got {text!r}")
    unit = (m.group(2) or "").upper().rstrip("B").rstrip("I")
    try:
        value = float(m.group(1))
    except ValueError:
        raise TrainerConfigError(f"{key}: expected a size like 64GB or 512MiB, got {text!r}") from None
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[unit]
    if value <= 0:
        raise TrainerConfigError(f"{key}: must be positive, got {text!r}")
    if not math.isfinite(value * scale) or value * scale >= 2 ** 80:      # a yobibyte: no device holds it
        raise TrainerConfigError(f"{key}: {text!r} is not a size any device has (at most 2**80 bytes)")
    return int(value * scale)


def _stored_numel(entry, tp: int, shards: int, ep: int = 1) -> tuple[int, int]:
    """(elements stored on a rank, elements of the TP-local tensor) of one parameter; `ep` > 1
    for the stacked expert weights: this rank's E / ep experts, FSDP-sharded over the shards / ep
    ranks holding the same experts (mf_parallel.shard_experts)."""
    shape = list(entry.shape)
    if tp > 1 and entry.tp_axis is not None:
        shape[entry.tp_axis] //= tp
    if ep > 1:
        shape[0] //= ep
        shards //= ep
    local = math.prod(shape)
    if shards > 1 and shape:
        return math.ceil(shape[0] / shards) * math.prod(shape[1:]), local
    return local, local


def _seq_length(cfg, args) -> int:
    config = cfg.train_dataset.dataloader.extra.get("config")
    seq = config.get("seq_length") if isinstance(config, dict) else None
    seq = seq or args.seq_length
    if not isinstance(seq, int) or seq <= 0:
        raise TrainerConfigError("train_dataset.dataloader.config.seq_length: needed for the activation estimate")
    return seq


def _recomputed(cfg, layers: int) -> tuple[set[int], dict[int, set[str]], list[str]]:
    """(fully recomputed layers, {layer: recomputed top-level modules}, notes)."""
    rc, notes = cfg.recompute, []
    if rc.mode == "full":
        return set(mf_config.parse_layer_spec(rc.full_recompute_layer, layers, "recompute.full_recompute_layer")), {}, []
    select: dict[int, set[str]] = {}
    if rc.mode == "select":
        for path, specs in rc.select_module.items():
            top = mf_models.layer_module_path(path).split(".")[0]   # MindFormers' `mlp` is feed_forward
            if top not in MODULES or "." in path:
                notes.append(f"recompute.select_module.{path}: not estimated (only {', '.join(MODULES)} are; "
                             f"counted as kept)")
                continue
            for i in mf_config.parse_layer_spec(specs, layers, f"recompute.select_module.{path}"):
                select.setdefault(i, set()).add(top)
    return set(), select, notes


def _swapped(cfg, args, layers: int) -> tuple[set[int], dict[int, set[str]], list[str]]:
    """(layers swapped whole, {layer: swapped top-level modules}, notes): `swap` in mf's module
    names (MindFormers' resolved per layer, as mf_trainer.swap does)."""
    sw, notes = cfg.swap, []
    if not sw.enable:
        return set(), {}, notes
    whole: set[int] = set()
    for i, entry in enumerate(sw.layer_swap or []):
        whole.update(mf_config.parse_layer_spec(entry.layers, layers, f"swap.layer_swap[{i}].layers"))
    modules: dict[int, set[str]] = {}
    for i, entry in enumerate(sw.op_swap or []):
        for layer in mf_config.parse_layer_spec(entry.layers, layers, f"swap.op_swap[{i}].layers"):
            path = mf_models.module_in_layer(entry.op_name, mf_models.layer_modules(args, layer))
            if path is None:
                continue                   # the preflight's line names it
            if path not in MODULES:
                notes.append(f"swap.op_swap[{i}] {entry.op_name}: not estimated (only whole modules are; counted "
                             "as kept)")
                break
            modules.setdefault(layer, set()).add(path)
    return whole, modules, notes


def _regathered(cfg, layers: int, tp: int) -> dict[int, set[str]]:
    """{layer: modules whose input all-gather recompute_comm re-does in backward} (tp > 1 only:
    without tensor parallelism there is no gather, and the preflight refuses the section)."""
    rc = cfg.recompute_comm
    if not rc.enable or tp <= 1:
        return {}
    out: dict[int, set[str]] = {}
    for key, specs in rc.select_module.items():
        module = mf_models.RECOMPUTE_COMM_MODULES.get(key)
        if module is None:
            continue                       # the preflight's line names it
        for i in mf_config.parse_layer_spec(specs, layers, f"recompute_comm.select_module['{key}']"):
            out.setdefault(i, set()).add(module)
    return out


def memory_plan(cfg, layout: mp.Layout) -> MemoryPlan:
    """The estimate for `cfg` run in `layout` (mf_parallel.Layout: the resolved `parallelism`
    section with its world and device; device None = context.device_target) (see the module
    docstring). Raises TrainerConfigError / ModelConfigError (one line) for what it cannot size."""
    if layout.dims is None:
        raise TrainerConfigError("parallelism: the memory estimate needs the world size")
    try:
        _, args = mf_models.build_args(model_section(cfg))
        inventory = mf_models.parameter_inventory(args)
    except mf_models.ModelConfigError as exc:
        raise TrainerConfigError(str(exc)) from None
    dims = layout.dims
    tp, shards = dims.tp, dims.dp_shard * dims.cp
    seq = _seq_length(cfg, args)
    local_seq = seq // dims.cp
    batch = cfg.training.local_batch_size
    device = layout.device or cfg.context.device_target
    compute = "float32" if device == "CPU" else args.compute_dtype
    act_bytes, p_bytes = DTYPE_BYTES[compute], DTYPE_BYTES[args.params_dtype]
    accum = accumulation(cfg.training, dims.dp)
    n_layers = args.num_hidden_layers

    # The fused kernel exists on Ascend only (CPU runs the plain-math attention whatever the YAML says).
    fused = bool(args.use_flash_attention) and device != "CPU"
    # Elements of one micro-batch: the per-sample terms times local_batch_size, except a MoE
    # layer's, which the dispatcher lays out over all the micro-batch's tokens at once (its weight
    # blocks grow with the experts, not with the tokens): sized for batch x shard tokens.
    per_layer = []
    for i in range(n_layers):
        one = mf_models.saved_activations(args, local_seq, tp, fused_attention=fused, layer=i)
        terms = {k: v * batch for k, v in one.items()}
        if "moe" in one:
            terms["moe"] = mf_models.moe_activations(args, batch * -(-local_seq // tp), dims.ep)["total"]
        per_layer.append(terms)
    terms = per_layer[0] if per_layer else {"head": 0}
    full, select, notes = _recomputed(cfg, n_layers)
    regathered = _regathered(cfg, n_layers, tp)
    # A re-gathered module input is held as the norm's output shard, not the full sequence.
    gather_saving = (local_seq - -(-local_seq // tp)) * args.hidden_size * batch

    def layer_elems(i: int) -> int:
        return sum(per_layer[i].get(m, 0) for m in MODULES)

    def kept(i: int) -> int:
        """Elements layer i keeps on the device from its forward to its backward."""
        return on_device(i) - sum(swapped_elems(i).values())

    def on_device(i: int) -> int:
        """... before swap."""
        if i in full:
            return -(-local_seq // tp) * args.hidden_size * batch     # the layer's input shard
        recomputed = select.get(i, set())
        # a module recomputed whole already drops its gathered input (its norm keeps the shard)
        comm = sum(gather_saving for m in regathered.get(i, ()) if m not in recomputed)
        return layer_elems(i) - sum(per_layer[i].get(m, 0) for m in recomputed) - comm

    # swap: what goes to host memory between a unit's forward and its backward. On CPU the host is
    # the device, so nothing leaves it.
    swap_whole, swap_modules, swap_notes = _swapped(cfg, args, n_layers)
    offloading = device != "CPU"

    def swapped_elems(i: int) -> dict[str, int]:
        """{unit: elements it moves to host} of layer i (a recomputed layer's: its input)."""
        if not offloading:
            return {}
        if i in swap_whole:
            return {f"layers.{i}": on_device(i)}
        if i in full:
            return {}                # the input it keeps is the layer's, saved outside its modules
        recomputed = select.get(i, set())
        return {f"layers.{i}.{m}": per_layer[i].get(m, 0) for m in swap_modules.get(i, ()) if m not in recomputed}

    # Pipeline: which layers and ends each rank holds, and how many micro-batches it keeps at once.
    spec = layout.pipeline
    stages: list[tuple[tuple[int, ...], bool, bool, int]] = []
    if spec.pp == 1:
        stages.append((tuple(range(n_layers)), True, True, 1))
    else:
        stage_layout = layout.stage_layout(n_layers, mf_config.pipeline_layer_placement)
        sim = mp.simulate_schedule(mp.build_schedule(spec, accum), mp.Costs.parse("1,1,1"), "async")
        for r in range(spec.pp):
            chunks = stage_layout.chunks(r)
            ids = tuple(i for c in chunks for i in c.layers)
            # peak_in_flight counts (micro-batch, chunk) pairs; a chunk holds 1/chunks of the rank's layers
            stages.append((ids, any(c.first for c in chunks), any(c.last for c in chunks),
                           max(1, math.ceil(sim.ranks[r].peak_in_flight / len(chunks)))))
        notes.append("pipeline in flight: the schedule's peak (micro-batch, chunk) pairs over the rank's chunks")

    # FSDP keeps every unit's gathered parameters from forward to backward (its policy, resolved)
    never = not layout.reshard_after_forward(last=False)
    # Each entry's layer, found once: a stage looks only at its own layers' entries and the rest
    # (ranks x entries would be quadratic in pipeline stages).
    by_layer: dict[int, list] = {}
    others = []
    for e in inventory:
        m = LAYER.match(e.name)
        if m:
            by_layer.setdefault(int(m.group(1)), []).append(e)
        else:
            others.append(e)
    ranks = []
    for pp_rank, (ids, first, last, in_flight) in enumerate(stages):
        stored = local_total = trained = kept_gathered = 0
        unit_local: dict[str, int] = {}
        for e in [e for i in sorted(set(ids)) for e in by_layer.get(i, ())] + others:
            m = LAYER.match(e.name)
            if m:
                unit = f"layers.{m.group(1)}"
            elif e.name == "tok_embeddings.weight":
                if not (first or (last and args.tie_word_embeddings)):
                    continue
                unit = "root"
            elif not last:
                continue
            else:
                unit = "root"
            expert = dims.ep > 1 and EXPERT_WEIGHT.search(e.name) is not None
            s, loc = _stored_numel(e, tp, shards, dims.ep if expert else 1)
            stored += s
            trained += s if e.trainable else 0
            if expert and shards == dims.ep:
                continue          # this rank's experts whole: nothing gathered, no reduce-scatter
            local_total += loc
            if KEPT_GATHERED.search(e.name):
                kept_gathered += loc
                unit += ".moe"            # the router and the experts: their own units
            unit_local[unit] = unit_local.get(unit, 0) + loc
        rank = RankMemory(pp_rank, ids, in_flight=in_flight)
        rank.parameters = stored * p_bytes
        rank.gradients = trained * (4 if accum > 1 else p_bytes)
        rank.optimizer = trained * 4 * 2
        act = sum(kept(i) for i in ids) + (terms["head"] if last else 0)
        rank.activations_per_microbatch = act * act_bytes
        rebuilt = max([layer_elems(i) - on_device(i) for i in ids] + [0])
        # The loss fused with the output projection: a chunk's logits, log-softmax and softmax - onehot
        # (float32) and the head's weight gradient, at the end of the forward (mf_parallel's
        # LinearCrossEntropy; measured on 8 x 256 tokens of a 2000-word vocabulary, one 16 MiB
        # chunk: 95 MiB below the loss on the whole logits, which kept two and made three more).
        vocab = args.vocab_size // tp
        chunk = min(batch * (seq // dims.cp), max(1, mp.LINEAR_CE_CHUNK_BYTES // (4 * vocab)))
        loss_end = (chunk * vocab * LOSS_BUFFERS * 4 + vocab * args.hidden_size * act_bytes) if last else 0
        # Backward through a layer makes the gradients of its saved tensors (same shapes) and frees the
        # tensors and gradients as it goes: about half a layer's worth at once, recomputed or not.
        working = max(layer_elems(i) for i in ids) // 2 if ids else 0
        # swap: one unit's activations are on the device at a time (its forward, or back for its backward)
        swapping = max((v for i in ids for v in swapped_elems(i).values()), default=0)
        rank.transient = max(loss_end, (rebuilt + working + swapping) * act_bytes)
        if shards > 1:
            biggest = max(unit_local.values(), default=0)
            resharded = max((v for k, v in unit_local.items() if not k.endswith(".moe")), default=0)
            gathered = local_total if never else resharded + kept_gathered
            # gathered parameters (param dtype) and the full gradient before its reduce-scatter (float32)
            rank.fsdp_gathered = gathered * p_bytes + biggest * 4
        ranks.append(rank)
    if compute != args.compute_dtype:
        notes.append(f"activations in float32 on device_target {device} (model.compute_dtype {args.compute_dtype} "
                     f"has no CPU kernels)")
    if regathered:
        count = sum(len(m - select.get(i, set())) for i, m in regathered.items())
        notes.append(f"recompute_comm: {count} sequence-parallel all-gathered inputs kept as shards, "
                     f"{count * gather_saving * act_bytes / 2**20:.1f} MiB less per micro-batch (on the ranks holding "
                     "their layers)")
    notes += swap_notes
    if swap_whole or swap_modules:
        host = sum(v for i in range(n_layers) for v in swapped_elems(i).values()) * act_bytes
        notes.append(f"swap: {host / 2**20:.1f} MiB per micro-batch of saved activations in host memory (every "
                     "layer's; a pipeline rank holds its own layers' share); one swapped unit's on the device at a "
                     "time" if offloading else
                     f"swap: device_target {device} keeps activations in host memory already: nothing leaves the "
                     "device")
    notes += [f"micro-batches per step: {accum}; sequence {seq}, local_batch_size {batch}"]
    return MemoryPlan(dims.describe(), ranks, notes)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidate_layouts(cfg, world: int, device_memory: int | None = None, device: str | None = None) -> list[str]:
    """A table of the peak per rank of the layouts of `world` ranks: tensor_parallel (up to 8, dividing
    the heads) x pipeline_parallel (dividing the layers' count is not required) x the data-parallel
    rest as FSDP, each without recompute and with full recompute; other keys as in `cfg`. Each
    candidate is its own resolved layout (mf_parallel.Layout) on `device`."""
    base = mf_config.config_to_dict(cfg)
    _, args = mf_models.build_args(model_section(cfg))
    rows = []
    for tp in [d for d in _divisors(world) if d <= 8]:
        if mf_models.tensor_parallel_problems(args, tp, world):
            continue
        for pp in [d for d in _divisors(world // tp) if d <= args.num_hidden_layers]:
            peaks = []
            for mode in ("None", "full"):
                raw = {**base, "parallelism": {**base.get("parallelism", {}), "tensor_parallel": tp,
                                               "pipeline_parallel": pp, "data_parallel_shard": -1,
                                               "pipeline_parallel_layers_per_stage": None},
                       "recompute": ({"mode": "None"} if mode == "None" else
                                     {"mode": "full", "full_recompute_layer": [f"0-{args.num_hidden_layers - 1}"]})}
                try:
                    candidate = mf_config.load_config(raw)
                    peaks.append(memory_plan(candidate, mp.Layout.resolve(candidate.parallelism, world, device)).peak)
                except (TrainerConfigError, mf_config.ConfigError, mp.ParallelConfigError) as exc:
                    peaks.append(str(exc).split(":")[0])
            rows.append((tp, pp, world // (tp * pp), peaks))
    out = [f"candidate layouts of {world} ranks (peak per rank; FSDP over the data-parallel rest):",
           f"  {'tp':>3}{'pp':>4}{'fsdp':>6}{'no recompute':>16}{'full recompute':>16}"]
    for tp, pp, dp, peaks in rows:
        cells = []
        for p in peaks:
            if isinstance(p, str):
                cells.append(f"{'refused (' + p + ')':>16}")
                continue
            mark = "" if device_memory is None else (" ok" if p <= device_memory else " no")
            cells.append(f"{fmt_bytes(p) + mark:>16}")
        out.append(f"  {tp:>3}{pp:>4}{dp:>6}" + "".join(cells))
    if device_memory is not None:
        out.append(f"  ok: fits in {fmt_bytes(device_memory)}; no: does not")
    return out
