"""mf-data benchmarks: each line is `name: ours X, reference Y, ratio Z`, measured side by side.

1. Index building against Megatron-Core 0.16.1's compiled helpers (`megatron.core.datasets.
   helpers_cpp`, run in the reference venv: see _references.py), on the same inputs, with the
   arrays checked identical to Megatron's before anything is timed:
   - sample_index: `build_sample_idx` alone (Megatron's Python wrapper around its C++ walk, as
     GPTDataset calls it) for 100M tokens, seq 4096, 3 epochs;
   - index_build: the whole GPTDataset build (document index, sample index, shuffle index; the
     two shuffles are numpy's RandomState in both, Megatron's own functions on its side);
   - blend_indices / blend_indices_exhaustive: BlendedDataset's indices (arrays allocated and
     filled as Megatron's BlendedDataset does), 3 datasets and 12 datasets.
   ratio = reference time / ours (> 1: ours is faster). Target >= 1. mf-data's numpy fallback
   (what runs when its C extension was not built) is timed too, for information.
2. sample_reads: random samples (seq 4096, batches of 8) read through the dataset's indices,
   vs raw `np.memmap` slicing of exactly the same bytes with the offsets precomputed.
   ratio = ours samples/s / reference samples/s. Target >= 0.7. `sample_columns` adds the cost
   of building every training column (labels, loss mask, positions) on top of the read.
3. preprocess_2_workers: `mf-data preprocess --workers 2` end to end (read jsonl, encode,
   write .bin/.idx) vs 2 x the tokens/s of one process running sentencepiece encode alone
   (ideal scaling), and vs two such encode processes actually running side by side (the same
   reference, but measured under the machine's current load, as ours is).
   ratio = ours / reference. Target >= 0.85 (issue 28).

Each figure is the median over interleaved rounds (ours, reference, ours, ...), which keeps the
comparison fair on a machine shared with other jobs; absolute times on such a machine are noisy.
`--small` shrinks every size (seconds instead of minutes).
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager, redirect_stderr
from pathlib import Path

import numpy as np
from _references import SETUP_HINT, reference_python

from mf_data import BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig, IndexedDatasetBuilder, helpers


def line(name: str, ours: str, reference: str, ratio: float, note: str = "") -> None:
    print(f"{name}: ours {ours}, reference {reference}, ratio {ratio:.2f}{(' ' + note) if note else ''}", flush=True)


def rounds(fns: list[Callable[[], float]], n: int) -> list[list[float]]:
    """Run the functions interleaved n times; returns each one's results."""
    out: list[list[float]] = [[] for _ in fns]
    for _ in range(n):
        for i, fn in enumerate(fns):
            out[i].append(fn())
    return out


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


# --- 1. index build ---------------------------------------------------------------------------


def write_index_only(prefix: str, lengths: np.ndarray, dtype=np.uint16) -> None:
    """A Megatron .idx for `lengths` and a sparse .bin of the right size (the build reads no tokens)."""
    itemsize = np.dtype(dtype).itemsize
    pointers = np.zeros(lengths.size, np.int64)
    np.cumsum(lengths[:-1] * itemsize, out=pointers[1:])
    docs = np.arange(lengths.size + 1, dtype=np.int64)
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + bytes([8]) + struct.pack("<QQ", lengths.size, docs.size))
        f.write(lengths.astype(np.int32).tobytes() + pointers.tobytes() + docs.tobytes())
    with open(prefix + ".bin", "wb") as f:
        f.truncate(int(lengths.sum()) * itemsize)


MEGATRON_PROBE = "import megatron.core.datasets.helpers_cpp"


class MegatronWorker:
    """Megatron-Core's index builders in the reference interpreter, timed there (no IPC inside
    the clock); requests and replies are JSON lines, arrays go through .npy files."""

    def __init__(self, python: str, workdir: str) -> None:
        self.workdir = workdir
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        self.proc = subprocess.Popen([python, str(Path(__file__).with_name("_megatron_worker.py"))], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        self.info = json.loads(self.proc.stdout.readline() or '{"ready": false, "error": "worker died"}')

    def call(self, op: str, **kwargs) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, **kwargs}) + "\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline() or '{"error": "worker died"}')
        if "error" in reply:
            raise RuntimeError(f"megatron worker: {reply['error']}")
        return reply

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@contextmanager
def _numpy_helpers():
    """mf_data.helpers on its numpy versions (its C extension set aside) inside the block."""
    saved = helpers._compiled
    helpers._compiled = None
    try:
        yield
    finally:
        helpers._compiled = saved


def _same(ours: dict[str, np.ndarray], path: str) -> list[str]:
    with np.load(path) as theirs:
        return [k for k in theirs.files if not (ours[k].dtype == theirs[k].dtype and np.array_equal(ours[k], theirs[k]))]


def bench_index_build(workdir: str, total_tokens: int, seq: int, n_rounds: int, mega: MegatronWorker | None) -> None:
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(6.5, 1.0, size=total_tokens // 500), 16, 32000).astype(np.int64)
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), total_tokens)) + 1]
    prefix = os.path.join(workdir, "index_bench")
    write_index_only(prefix, lengths)
    tokens = int(lengths.sum())
    num_samples = (3 * tokens - 1) // seq - 10  # needs exactly 3 epochs
    cfg = GPTDatasetConfig(random_seed=1234, sequence_length=seq, blend=([prefix], None), split="1", eod=1,
                           create_attention_mask=False, path_to_cache=os.path.join(workdir, "unused"))
    gpt = BlendedMegatronDatasetBuilder(GPTDataset, [num_samples, None, None], None, cfg).build()[0]
    plan = gpt._plan()
    assert plan["epochs"] == 3, plan
    sizes = gpt.dataset.sequence_lengths
    doc = np.asarray(gpt.document_index)
    inputs = os.path.join(workdir, "index_inputs.npz")
    np.savez(inputs, sizes=sizes, documents=gpt.indices, document_index=doc)
    args = {"inputs": inputs, "seq": seq, "epochs": plan["epochs"], "tokens": plan["tokens"], "seed": cfg.random_seed,
            "separate": int(plan["separate"]), "first": plan["sans_final"]}

    def sample_index() -> np.ndarray:
        return helpers.build_sample_idx(sizes, doc, seq, plan["epochs"], plan["tokens"], True, True)

    def full_build() -> dict[str, np.ndarray]:
        return gpt._build(plan)

    built = full_build()
    for k in ("document_index", "sample_index", "shuffle_index"):
        assert np.array_equal(built[k], getattr(gpt, k)), k
    with _numpy_helpers():
        assert all(np.array_equal(built[k], v) for k, v in full_build().items()), "compiled and numpy indices differ"
    name = f"({tokens / 1e6:.0f}M tokens, {lengths.size} docs, seq {seq}, 3 epochs, {len(gpt)} samples)"
    if mega is None:
        print(f"index_build {name}: reference missing (megatron-core not importable; {SETUP_HINT})", flush=True)
        return
    for op in ("sample_index", "index_build"):
        saved = os.path.join(workdir, f"megatron_{op}.npz")
        mega.call(op, save=saved, **args)
        differ = _same(built, saved)
        assert not differ, f"{op}: Megatron's {differ} differ from ours"

    def ours_numpy(fn: Callable[[], object]) -> float:
        with _numpy_helpers():
            return timed(fn)

    for op, fn in (("sample_index", sample_index), ("index_build", full_build)):
        ours_t, numpy_t, mega_t = rounds([lambda fn=fn: timed(fn), lambda fn=fn: ours_numpy(fn),
                                          lambda op=op: mega.call(op, **args)["seconds"]], n_rounds)
        o, n, m = statistics.median(ours_t), statistics.median(numpy_t), statistics.median(mega_t)
        what = "build_sample_idx alone" if op == "sample_index" else "document + sample + shuffle indices"
        line(f"{op} {name}, {what}", f"{o * 1e3:.2f} ms", f"{m * 1e3:.2f} ms (megatron-core {mega.info['version']} helpers_cpp)",
             m / o, "(reference time / ours, target >= 1; arrays identical)")
        line(f"{op} {name}, mf-data's numpy fallback", f"{n * 1e3:.2f} ms", f"{m * 1e3:.2f} ms (megatron-core)", m / n,
             "(reference time / ours; for information: used when the C extension is not built)")


def bench_blending(workdir: str, n_samples: int, n_rounds: int, mega: MegatronWorker | None) -> None:
    """BlendedDataset's indices: the greedy blend over `size` samples, and the exhaustive one."""
    cases = [("blend_indices", [0.2, 0.3, 0.5], n_samples)]
    w12 = np.random.default_rng(3).random(12) + 0.1
    cases.append(("blend_indices", (w12 / w12.sum()).tolist(), n_samples))
    caps = [int(n_samples * x) for x in (0.2, 0.3, 0.5)]
    cases.append(("blend_indices_exhaustive", caps, None))
    for name, weights, size in cases:
        if size is None:
            def ours(weights=weights):
                return helpers.build_exhaustive_blending_indices(weights)
            op, label = "exhaustive", f"{name} ({sum(weights)} samples, {len(weights)} datasets)"
        else:
            def ours(weights=weights, size=size):
                return helpers.build_blending_indices(weights, size)
            op, label = "blend", f"{name} ({size} samples, {len(weights)} datasets)"
        di, dsi = ours()
        with _numpy_helpers():
            ndi, ndsi = ours()
        assert np.array_equal(di, ndi) and np.array_equal(dsi, ndsi), "compiled and numpy blends differ"
        if mega is None:
            print(f"{label}: reference missing (megatron-core not importable; {SETUP_HINT})", flush=True)
            continue
        saved = os.path.join(workdir, "megatron_blend.npz")
        kwargs = {"weights": weights, "size": size}
        mega.call(op, save=saved, **kwargs)
        differ = _same({"dataset_index": di, "dataset_sample_index": dsi}, saved)
        assert not differ, f"{label}: Megatron's {differ} differ from ours"

        def ours_numpy(ours=ours) -> float:
            with _numpy_helpers():
                return timed(ours)

        ours_t, numpy_t, mega_t = rounds([lambda ours=ours: timed(ours), ours_numpy,
                                          lambda op=op, kwargs=kwargs: mega.call(op, **kwargs)["seconds"]], n_rounds)
        o, n, m = statistics.median(ours_t), statistics.median(numpy_t), statistics.median(mega_t)
        line(label, f"{o * 1e3:.2f} ms", f"{m * 1e3:.2f} ms (megatron-core helpers_cpp)", m / o,
             "(reference time / ours, target >= 1; arrays identical)")
        line(f"{label}, mf-data's numpy fallback", f"{n * 1e3:.2f} ms", f"{m * 1e3:.2f} ms (megatron-core)", m / n,
             "(reference time / ours; for information)")


# --- 2. random-access reads -------------------------------------------------------------------


def bench_reads(workdir: str, total_tokens: int, seq: int, n_samples: int, n_rounds: int, batch: int = 8) -> None:
    rng = np.random.default_rng(1)
    lengths = np.clip(rng.lognormal(6.5, 1.0, size=total_tokens // 500), 16, 32000).astype(np.int64)
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), total_tokens))]
    prefix = os.path.join(workdir, "read_bench")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    builder.add_documents(rng.integers(2, 32000, size=int(lengths.sum()), dtype=np.uint16), lengths, np.ones(lengths.size))
    builder.finalize(prefix + ".idx")
    cfg = GPTDatasetConfig(random_seed=7, sequence_length=seq, blend=([prefix], None), split="1", eod=1,
                           create_attention_mask=False, path_to_cache=os.path.join(workdir, "read_cache"))
    ds = BlendedMegatronDatasetBuilder(GPTDataset, [None, None, None], None, cfg).build()[0]
    picks = rng.integers(0, len(ds), size=n_samples)

    # The reference gets each sample's byte ranges for free (computed here, outside the timing).
    mm = np.memmap(prefix + ".bin", dtype=np.uint16, mode="r")
    item = ds.dataset.sequence_pointers // 2
    pieces = []
    for i in picks:
        row = int(ds.shuffle_index[i])
        (bd, bo), (ed, eo) = ds.sample_index[row], ds.sample_index[row + 1]
        spans = []
        for j in range(int(bd), int(ed) + 1):
            doc = int(ds.document_index[j])
            start = int(bo) if j == bd else 0
            stop = int(eo) + 1 if j == ed else int(ds.dataset.sequence_lengths[doc])
            spans.append((int(item[doc]) + start, int(item[doc]) + stop))
        pieces.append(spans)

    def reference() -> np.ndarray:
        out = None
        for k in range(0, len(pieces), batch):
            out = np.stack([np.concatenate([mm[a:b] for a, b in spans]) for spans in pieces[k : k + batch]])
        return out

    def ours_read() -> None:
        for k in range(0, len(picks), batch):
            ds.read_text(picks[k : k + batch])

    def ours_columns() -> None:
        for k in range(0, len(picks), batch):
            ds.get_batch(picks[k : k + batch])

    check = np.stack([np.concatenate([mm[a:b] for a, b in spans]) for spans in pieces[:batch]])
    assert np.array_equal(ds.read_text(picks[:batch])[0], check), "the reference reads other bytes"
    reference(), ours_read()  # warm the page cache for both
    read_t, col_t, ref_t = rounds([lambda: timed(ours_read), lambda: timed(ours_columns), lambda: timed(reference)], n_rounds)
    ref_rate = n_samples / statistics.median(ref_t)
    for name, times in (("sample_reads", read_t), ("sample_columns", col_t)):
        ratios = [(n_samples / t) / (n_samples / r) for t, r in zip(times, ref_t)]
        rate = n_samples / statistics.median(times)
        line(f"{name} (seq {seq}, random, batches of {batch}, {ds.dataset.num_tokens / 1e6:.0f}M-token file)",
             f"{rate:,.0f} samples/s", f"{ref_rate:,.0f} samples/s (np.memmap slicing)", statistics.median(ratios),
             "(ours / reference, target >= 0.7)" if name == "sample_reads" else "(all training columns built too)")


# --- 3. preprocessing --------------------------------------------------------------------------


def preprocess_inputs(workdir: str, copies: int, vocab: int) -> tuple[str, str]:
    """(corpus.jsonl: the demo documents `copies` times, a sentencepiece model of `vocab` trained on
    them) in `workdir`: the preprocess benchmark's inputs (profile_preprocess.py uses them too)."""
    from mf_data.demo_corpus import demo_documents
    from mf_data.tokenizer import train_sentencepiece

    docs = list(demo_documents())
    corpus = os.path.join(workdir, "corpus.jsonl")
    with open(corpus, "w") as f:
        for c in range(copies):
            for d in docs:
                f.write(json.dumps({"id": f"{d['id']}#{c}", "text": d["text"]}) + "\n")
    model = os.path.join(workdir, "bench.model")
    seed_corpus = os.path.join(workdir, "seed.jsonl")
    with open(seed_corpus, "w") as f:
        f.writelines(json.dumps(d) + "\n" for d in docs)
    train_sentencepiece([seed_corpus], model, vocab_size=vocab)
    return corpus, model


def bench_preprocess(workdir: str, copies: int, vocab: int, n_rounds: int) -> None:
    import sentencepiece

    from mf_data.demo_corpus import demo_documents
    from mf_data.preprocess import preprocess

    corpus, model = preprocess_inputs(workdir, copies, vocab)
    texts = [d["text"] for _ in range(copies) for d in demo_documents()]
    sp = sentencepiece.SentencePieceProcessor(model_file=model)

    def single_encode() -> float:
        t = time.perf_counter()
        n = 0
        for k in range(0, len(texts), 512):
            n += sum(len(ids) for ids in sp.encode(texts[k : k + 512], out_type=int, num_threads=1))
        return n / (time.perf_counter() - t)

    # Two encoders running side by side, started (model loaded, texts in place) before the clock:
    # the same "2 x single-process encode" but under the machine's current load, like ours.
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    halves = [texts[0::2], texts[1::2]]
    with ctx.Pool(2, initializer=_encoder_init, initargs=(model, halves)) as pool:
        pool.map(_encoder_warm, [0, 1], chunksize=1)

        def two_encoders() -> float:
            t = time.perf_counter()
            n = sum(pool.map(_encoder_run, [0, 1], chunksize=1))
            return n / (time.perf_counter() - t)

        def ours() -> float:
            with redirect_stderr(io.StringIO()):
                summary = preprocess([corpus], model, os.path.join(workdir, "pre"), append_eod=True, workers=2,
                                     overwrite=True, progress=False)
            return sum(summary["tokens"].values()) / summary["seconds"]

        ours_r, pair_r, single_r = rounds([ours, two_encoders, single_encode], n_rounds)
    mb = os.path.getsize(corpus) / 1e6
    name = f"preprocess_2_workers ({mb:.1f} MB jsonl, vocab {vocab})"
    line(name, f"{statistics.median(ours_r):,.0f} tokens/s",
         f"{2 * statistics.median(single_r):,.0f} tokens/s (2 x one sentencepiece encode process)",
         statistics.median([o / (2 * s) for o, s in zip(ours_r, single_r)]), "(ours / reference, target >= 0.85)")
    line(f"{name}, load-matched", f"{statistics.median(ours_r):,.0f} tokens/s",
         f"{statistics.median(pair_r):,.0f} tokens/s (2 encode processes running side by side)",
         statistics.median([o / p for o, p in zip(ours_r, pair_r)]), "(ours / reference)")


_enc: dict[str, object] = {}


def _encoder_init(model: str, halves: list[list[str]]) -> None:
    import sentencepiece

    _enc["sp"] = sentencepiece.SentencePieceProcessor(model_file=model)
    _enc["halves"] = halves


def _encoder_warm(_: int) -> int:
    return len(_enc["halves"])  # type: ignore[arg-type]


def _encoder_run(part: int) -> int:
    sp, texts = _enc["sp"], _enc["halves"][part]  # type: ignore[index]
    n = 0
    for k in range(0, len(texts), 512):
        n += sum(len(ids) for ids in sp.encode(texts[k : k + 512], out_type=int, num_threads=1))  # type: ignore[union-attr]
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="smaller sizes: seconds instead of minutes")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds per figure")
    ap.add_argument("--only", choices=["index", "reads", "preprocess"], action="append", help="run only these parts")
    args = ap.parse_args(argv)
    small = args.small
    n_rounds = args.rounds or (3 if small else 5)
    parts = set(args.only or ["index", "reads", "preprocess"])
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# {os.cpu_count()} cores, load average {load:.1f}: figures are medians of {n_rounds} interleaved rounds; "
          "absolute numbers are noisy on a shared machine, ratios less so", flush=True)
    print(f"# mf_data.helpers runs its {helpers.BACKEND} loops", flush=True)
    with tempfile.TemporaryDirectory(prefix="mf-data-bench-") as workdir:
        if "index" in parts:
            python = reference_python(MEGATRON_PROBE)
            mega = MegatronWorker(python, workdir) if python else None
            if mega is not None and not mega.info["ready"]:
                print(f"# megatron worker failed: {mega.info['error']}", flush=True)
                mega = None
            try:
                bench_index_build(workdir, 10_000_000 if small else 100_000_000, 4096, 3 * n_rounds, mega)
                bench_blending(workdir, 200_000 if small else 1_000_000, 3 * n_rounds, mega)
            finally:
                if mega is not None:
                    mega.close()
        if "reads" in parts:
            bench_reads(workdir, 5_000_000 if small else 20_000_000, 4096, 400 if small else 2000, n_rounds)
        if "preprocess" in parts:
            bench_preprocess(workdir, 2 if small else 24, 2000 if small else 4000, n_rounds)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# load average {load:.1f} at the end", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
