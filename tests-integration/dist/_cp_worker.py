"""Context parallelism on CPU ranks: the attention Cells against float64 numpy, then the tiny models
under each CP layout against one process on the full sequence. One launch per world size runs
every case (see _launches.CP_WORLD2_CASES / CP_WORLD4_CASES); one RESULT line per check and rank.

Usage: _cp_worker.py CASE [CASE ...]   (model cases, see MODEL_CASES)

Attention checks (every launch): ring / Ulysses (/ hybrid on 4 ranks) forward and backward on
random fp32 inputs with GQA, fully masked rows and packed documents, against full attention in
float64 numpy; in PyNative, and Ulysses compiled (GRAPH_MODE) on 2 ranks (the ring compiles in
the Trainer's cp2 step, and ad hoc in the model case llama_cp2_packed_graph).

Model cases: the same seed builds the plain model (the reference, every rank computes it alone on
the whole batch and full sequence, in fp32) and the parallelized one; each rank feeds its data-
parallel samples sliced by `slice_for_context_parallel`, the loss is sum(token loss x mask) /
tokens of the global batch, and the check is: the sum of the ranks' losses over dp x cp equals the
reference loss, and every rank's gradient block (FSDP and TP shards) equals the reference
gradient's block, within 1e-5 relative.
"""

from __future__ import annotations

import logging
import os
import sys
import time

import mindspore as ms
import numpy as np
from _results import emit, run_check
from mindspore import Tensor, nn, ops

import mf_models
import mf_parallel as mp

ms.set_context(mode=ms.PYNATIVE_MODE)
WORLD = int(os.environ.get("MS_WORKER_NUM", "1"))
MASK = -3.4028234663852886e38
RTOL = 1e-5
records: list[str] = []


class _Capture(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())


logging.getLogger("mf_parallel").addHandler(_Capture())
logging.getLogger("mf_parallel").setLevel(logging.INFO)


# ----------------------------------------------------------------------------- numpy references
def attention_reference(q, k, v, masked, scale, dout):
    """Full attention in float64 with CoreAttention's semantics and its gradients (dout given)."""
    q, k, v, dout = (np.asarray(a, np.float64) for a in (q, k, v, dout))
    b, heads, s, _ = q.shape
    g = heads // k.shape[1]
    kr, vr = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    scores = np.where(masked[:, None], MASK, q @ kr.transpose(0, 1, 3, 2) * scale)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = p @ vr
    dp = dout @ vr.transpose(0, 1, 3, 2)
    ds = np.where(masked[:, None], 0.0, p * (dp - (dp * p).sum(-1, keepdims=True)))
    dq = ds @ kr * scale
    dk = (ds.transpose(0, 1, 3, 2) @ q * scale).reshape(b, k.shape[1], g, s, -1).sum(2)
    dv = (p.transpose(0, 1, 3, 2) @ dout).reshape(b, k.shape[1], g, s, -1).sum(2)
    return out, dq, dk, dv


class CoreMath(nn.Cell):
    """What mf-models' CoreAttention computes (the inner core Ulysses runs)."""

    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def construct(self, q, k, v, mask):
        g = q.shape[1] // k.shape[1]
        b, h, t, d = k.shape
        k = ops.broadcast_to(ops.expand_dims(k, 2), (b, h, g, t, d)).reshape(b, h * g, t, d)
        v = ops.broadcast_to(ops.expand_dims(v, 2), (b, h, g, t, v.shape[-1])).reshape(b, h * g, t, -1)
        scores = ops.BatchMatMul(transpose_b=True)(q, k) * self.scale
        scores = ops.masked_fill(scores, mask, MASK)
        return ops.BatchMatMul()(ops.softmax(scores, -1), v)


class Weighted(nn.Cell):
    def __init__(self, attn):
        super().__init__()
        self.attn = attn

    def construct(self, q, k, v, seg, dout):
        return (self.attn(q, k, v, seg) * dout).sum()


def packed_segments(batch: int, seq: int) -> np.ndarray:
    """Documents of uneven lengths, one crossing every chunk boundary, and padding rows (-1: they see
    nothing, a fully masked row, and nobody sees them)."""
    seg = np.zeros((batch, seq), np.int32)
    cuts = [0, 5, 11, 12, 19, 27, seq]
    for i in range(len(cuts) - 1):
        seg[0, cuts[i]:cuts[i + 1]] = cuts[i]
    seg[0, 12:15] = -1
    if batch > 1:
        seg[1, seq // 2:] = seq // 2
        seg[1, -2:] = -1
    return seg


def check_attention(mesh, method, ulysses, heads, kv_heads, packed, async_comm=False, graph=False):
    b, s, d, dv, scale = 2, 32, 4, 6, 0.45
    rng = np.random.default_rng(7)
    q = rng.standard_normal((b, heads, s, d))
    k = rng.standard_normal((b, kv_heads, s, d))
    v = rng.standard_normal((b, kv_heads, s, dv))
    dout = rng.standard_normal((b, heads, s, dv))
    seg = packed_segments(b, s) if packed else None
    masked = mp.masked_from_segments(seg) if packed else np.broadcast_to(np.triu(np.ones((s, s), bool), 1), (b, s, s))
    want = attention_reference(q, k, v, masked, scale, dout)
    settings = mp.ContextParallelSettings(method, ulysses, async_comm=async_comm)
    cell = mp.context_parallel_attention(mesh, settings, scale=scale, inner=CoreMath(scale))
    idx = mp.zigzag_indices(s, mesh.dims.cp, mesh.dims.coordinate("cp", mesh.rank))

    def local(a):
        return Tensor(np.ascontiguousarray(a[:, :, idx]).astype(np.float32))

    args = (local(q), local(k), local(v), None if seg is None else Tensor(seg), local(dout))
    ms.set_context(mode=ms.GRAPH_MODE if graph else ms.PYNATIVE_MODE)
    try:
        out = cell(*args[:4]).asnumpy()
        grads = ms.grad(Weighted(cell), grad_position=(0, 1, 2))(*args)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    got = [out] + [g.asnumpy() for g in grads]
    errs = [float(np.abs(x - w[:, :, idx]).max() / np.abs(w).max()) for x, w in zip(got, want)]
    finite = all(np.isfinite(x).all() for x in got)
    return finite and max(errs) < 1e-5, f"relative errors out/dq/dk/dv {['%.1e' % e for e in errs]}"


def attention_checks(mesh):
    cases = [("colossal", None, 4, 2), ("ulysses", None, 4, 2)]
    if WORLD == 4:
        cases += [("hybrid", 2, 4, 2), ("ulysses", None, 4, 1)]      # one key head repeated for 4 ranks
    # Packed documents with padding rows only: the model cases cover each method's plain causal path.
    for method, u, heads, kv in cases:
        run_check(f"cp_attention[{method},u={u},heads={heads}/{kv},packed]", check_attention, mesh, method, u, heads,
                  kv, True)
    run_check("cp_attention[colossal,async,packed]", check_attention, mesh, "colossal", None, 4, 2, True, True)
    if WORLD == 2:     # the ring compiles inside the Trainer's cp2 step (test_trainer_parity.py)
        run_check("cp_attention[ulysses,graph,packed]", check_attention, mesh, "ulysses", None, 4, 2, True, False,
                  True)
    run_check("cp_async_said_once", async_said_once, mesh)
    run_check("cp_dense_mask_refused", dense_mask_refused, mesh)


def async_said_once(mesh):
    """context_parallel_async on CPU is said once, by the layout's notice (mf-trainer's preflight
    prints Layout.idle): the layout of this mesh lists it with the CPU reason and keeps the ring's
    order (async_comm stays on), and the async ring Cell built above said nothing itself (the
    runtime line it used to log moved into that notice in mf-parallel 0.6: one line, not two)."""
    layout = mp.Layout.for_dims(mesh.dims, {"context_parallel_async": True}, "CPU")
    said = [i.line() for i in layout.idle if i.field == "context_parallel_async"]
    logged = [r for r in records if "context_parallel_async" in r]
    ok = (len(said) == 1 and "synchronous on device_target CPU" in said[0] and layout.context.async_comm
          and not logged)
    return ok, f"layout notice {said}, mf_parallel log {logged}"


def dense_mask_refused(mesh):
    cell = mp.context_parallel_attention(mesh, mp.ContextParallelSettings(), scale=1.0)
    x = Tensor(np.zeros((1, 2, 8, 4), np.float32))
    try:
        cell(x, x, x, Tensor(np.zeros((1, 1, 8, 8), bool)))
    except ValueError as exc:
        return "segment_ids [B, S]" in str(exc), str(exc)
    return False, "a dense mask was accepted"


# ----------------------------------------------------------------------------- model cases
# name -> (model_type, parallel degrees, options, packed documents as "mask" | "eod" | None, mode).
# The launches run the subset in _launches.CP_WORLD*_CASES; the llama cases stay for ad-hoc runs.
MODEL_CASES = {
    "llama_cp2_colossal": ("llama", dict(cp=2), {}, None, 1),
    "qwen3_cp2_colossal": ("qwen3", dict(cp=2), {}, None, 1),
    "llama_cp2_ulysses": ("llama", dict(cp=2), dict(context_parallel_method="ulysses"), None, 1),
    "qwen3_cp2_ulysses": ("qwen3", dict(cp=2), dict(context_parallel_method="ulysses"), None, 1),
    "llama_cp2_packed_graph": ("llama", dict(cp=2), {}, "mask", 0),
    "qwen3_cp2_packed": ("qwen3", dict(cp=2), dict(context_parallel_async=True), "eod", 1),
    "deepseek_v3_cp2_packed": ("deepseek_v3", dict(cp=2), {}, "mask", 1),
    "llama_cp4_hybrid": ("llama", dict(cp=4), dict(context_parallel_method="hybrid", ulysses_degree_in_cp=2), None, 1),
    "qwen3_cp4_hybrid": ("qwen3", dict(cp=4), dict(context_parallel_method="hybrid", ulysses_degree_in_cp=2),
                         "mask", 1),
    "llama_cp2_tp2": ("llama", dict(cp=2, tp=2), {}, None, 1),
    "qwen3_cp2_tp2": ("qwen3", dict(cp=2, tp=2), dict(context_parallel_method="ulysses"), None, 1),
    "llama_cp2_fsdp2": ("llama", dict(cp=2, dp_shard=2), {}, "mask", 1),
    "qwen3_cp2_fsdp2": ("qwen3", dict(cp=2, dp_shard=2), dict(reshard_after_forward_policy="never"), None, 1),
}
BATCH, SEQ = 2, 32


def make_batch(packed: str | None):
    """Token ids, labels, loss mask, positions (restarting per document when packed) and the dense
    Megatron mask of the documents (built from the EOD tokens here, independently of mf-parallel)."""
    rng = np.random.default_rng(3)
    text = rng.integers(2, 64, (BATCH, SEQ + 1))
    if packed:
        text[0, [6, 13, 14, 22]] = 1          # EOD = 1: documents of 7, 7, 1, 8 and 10 tokens
        text[1, [15]] = 1
    ids, labels = text[:, :-1], text[:, 1:]
    loss_mask = np.ones((BATCH, SEQ), np.float32)
    loss_mask[0, :3] = 0
    positions = np.broadcast_to(np.arange(SEQ), (BATCH, SEQ)).copy()
    batch = {"input_ids": ids, "labels": labels, "loss_mask": loss_mask}
    dense = None
    if packed:
        eod = ids == 1
        doc = np.zeros((BATCH, SEQ), np.int64)
        doc[:, 1:] = np.cumsum(eod[:, :-1], axis=1)
        for b in range(BATCH):
            for d in np.unique(doc[b]):
                where = np.flatnonzero(doc[b] == d)
                positions[b, where] = np.arange(where.size)
        dense = (doc[:, :, None] != doc[:, None, :]) | np.triu(np.ones((SEQ, SEQ), bool), 1)[None]
        if packed == "mask":
            batch["attention_mask"] = dense[:, None]
        else:                                  # mf-data's compressed form: exclusive document ends, padded with S
            ends = np.full((BATCH, 6), SEQ, np.int32)
            for b in range(BATCH):
                stops = np.flatnonzero(eod[b, :-1]) + 1
                ends[b, :stops.size] = stops
            batch["actual_seq_len"] = ends
    batch["position_ids"] = positions
    return batch, dense


def token_loss(logits, labels):
    log_probs = ops.LogSoftmax(-1)(logits.astype(ms.float32))
    return -ops.gather_elements(log_probs, -1, labels.expand_dims(-1)).squeeze(-1)


class LossCell(nn.Cell):
    """sum(token loss * mask) * inv_tokens of model(*inputs) (vocab-parallel under tp)."""

    def __init__(self, model, cross_entropy=None):
        super().__init__(auto_prefix=False)
        self.model = model
        self.vocab_parallel = cross_entropy is not None
        self.cross_entropy = cross_entropy

    def construct(self, labels, loss_mask, inv_tokens, input_ids, position_ids, mask):
        logits = self.model(input_ids, position_ids, mask)
        if self.vocab_parallel:
            per_token = self.cross_entropy(logits, labels)
        else:
            per_token = token_loss(logits, labels)
        return (per_token * loss_mask).sum() * inv_tokens


def loss_and_grads(model, cross_entropy, labels, loss_mask, inv_tokens, ids, positions, mask):
    names = {id(p): name for name, p in model.parameters_and_names()}
    cell = LossCell(model, cross_entropy)
    params = model.trainable_params()
    loss, grads = ms.value_and_grad(cell, None, params)(
        Tensor(labels.astype(np.int32)), Tensor(loss_mask), Tensor(np.float32(inv_tokens)),
        Tensor(ids.astype(np.int32)), Tensor(positions.astype(np.int32)), mask)
    return float(loss.asnumpy()), {names[id(p)]: g.asnumpy() for p, g in zip(params, grads)}


def model_case(name: str):
    model_type, degrees, options, packed, mode = MODEL_CASES[name]
    dims = mp.ParallelDims(WORLD, **degrees)
    mesh = mp.init_mesh(dims)
    # llama as the Trainer parity tests have it: tied embeddings, attention biases
    extra = dict(tie_word_embeddings=True, attention_bias=True) if model_type == "llama" else {}
    section = mf_models.tiny_model_section(model_type, **extra)
    batch, dense = make_batch(packed)
    tokens = float(batch["loss_mask"].sum())
    ref_model = mf_models.build_model(section, seed=11)
    ref_mask = None if dense is None else Tensor(dense[:, None])
    want_loss, want = loss_and_grads(ref_model, None, batch["labels"], batch["loss_mask"], 1 / tokens,
                                     batch["input_ids"], batch["position_ids"], ref_mask)

    model = mf_models.build_model(section, seed=11)
    mf_models.parallelize_model(model, mesh, mf_models.ParallelOptions(mp.Layout.for_dims(dims, options)))
    rows = slice(dims.dp_rank(mesh.rank) * BATCH // dims.dp, (dims.dp_rank(mesh.rank) + 1) * BATCH // dims.dp)
    mine = mp.slice_for_context_parallel({k: v[rows] for k, v in batch.items()}, dims.cp,
                                         dims.coordinate("cp", mesh.rank))
    seg = Tensor(mine["segment_ids"]) if "segment_ids" in mine else None
    ce = mp.VocabParallelCrossEntropy(mesh["tp"]) if dims.tp > 1 else None
    ms.set_context(mode=mode)
    try:
        loss, grads = loss_and_grads(model, ce, mine["labels"], mine["loss_mask"], 1 / tokens, mine["input_ids"],
                                     mine["position_ids"], seg)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    total = float(mp.all_reduce(Tensor(np.array([loss], np.float32)), mesh["dp_cp"]).asnumpy()[0])
    layouts = mp.param_layouts(model, mesh)
    worst, worst_name = 0.0, ""
    for pname, grad in grads.items():
        lay = layouts[pname]
        block = lay.to_block(grad)
        ref = want[pname][tuple(slice(o, o + s) for o, s in zip(lay.offset, lay.shape))]
        err = float(np.abs(block - ref).max() / max(np.abs(want[pname]).max(), 1e-30)) if block.size else 0.0
        if err > worst:
            worst, worst_name = err, pname
    loss_err = abs(total - want_loss) / abs(want_loss)
    ok = loss_err <= RTOL and worst <= RTOL and len(grads) == len(want)
    emit(f"cp_model[{name}]", ok, f"{dims.describe()}: loss {total:.7f} vs {want_loss:.7f} (rel {loss_err:.1e}); "
                                  f"worst gradient {worst_name} rel {worst:.1e}; mode {mode}",
         loss=total, reference=want_loss, grad_err=worst)


def main(cases):
    """The attention checks, then the model `cases`; alone or after the Trainer cases of a shared
    launch (_world2_worker / _world4_worker), which may have left GRAPH_MODE set."""
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s", stream=sys.stdout)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    mesh = mp.init_mesh(mp.ParallelDims(WORLD, cp=WORLD))
    start = time.monotonic()
    attention_checks(mesh)
    print(f"CP attention checks took {time.monotonic() - start:.1f}s", flush=True)
    for name in cases:
        try:
            start = time.monotonic()
            model_case(name)
            print(f"CP case {name} took {time.monotonic() - start:.1f}s", flush=True)
        except Exception as exc:     # report, then stop: peers may be waiting in a collective
            import traceback

            emit(f"cp_model[{name}]", False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-2500:]}")
            raise
    emit("cp_done", True)


if __name__ == "__main__":
    main(sys.argv[1:])
