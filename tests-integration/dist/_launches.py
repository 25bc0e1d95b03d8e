"""What the dist launches run, shared by conftest.py and the tests (a plain module: the repository
root has a conftest.py too, so `from conftest import ...` would be ambiguous)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
TRAINER_WORKER = HERE / "_trainer_worker.py"
WORLD2_WORKER = HERE / "_world2_worker.py"     # the 2-rank Trainer cases, then the CP checks
WORLD4_WORKER = HERE / "_world4_worker.py"     # collectives, 4-rank Trainer cases, CP checks, probes
# Trainer cases per launch (see _trainer_worker.CASES). The 4-rank ones after the reference run:
# `fsdp2_tp2_from_reference` continues from the one-process checkpoint.
# The pipeline cases train the 4- and 6-layer models of `reference4` / `reference6`;
# `pp2_1f1b_from_reference4` continues the one-process checkpoint under PP2.
PIPELINE2_CASES = ("pp2_1f1b", "pp2_gpipe", "pp2_interleaved", "pp2_1f1b_split", "pp2_zbv", "pp2_1f1b_from_reference4")
# The README's pipeline command (`mf launch -n 2 examples/tiny/train.yaml --set
# parallelism.pipeline_parallel=2`) on the demo itself, under every schedule, against one process
# running the same YAML (`demo_reference`): 4 micro-batches of 4 samples, 4 steps, the demo's
# evaluation at the last step (_trainer_worker.DEMO_*).
DEMO_PIPELINE_CASES = ("demo_pp2_1f1b", "demo_pp2_gpipe", "demo_pp2_interleaved", "demo_pp2_1f1b_split", "demo_pp2_zbv")
# On 4 ranks: PP4, and PP2 stages FSDP-sharded over dp 2 / DDP replicas over dp 2 / under TP2 (all
# against reference4 / 6): 1f1b (with evaluation during training), then the other schedules'
# mechanisms with sharded stages: two chunks per rank with FSDP (interleaved + dx/dw split) and TP
# (zbv, whose backward is split), the deferred weight gradients under FSDP and TP, the V placement
# under both, gpipe once. Interleaved x TP adds no mechanism zbv x TP lacks (checked once by hand:
# 5.8e-7 / 3.2e-7).
SHARDED_STAGE_CASES = ("pp2_gpipe_tp2", "pp2_interleaved_split_fsdp2", "pp2_zbv_fsdp2", "pp2_zbv_tp2")
# `pp2_tp2_from_reference4` continues the one-process checkpoint under PP2 x TP2 (2 steps).
PIPELINE4_CASES = ("pp4_1f1b_uneven", "pp2_fsdp2", "pp2_ddp2", "pp2_tp2", *SHARDED_STAGE_CASES, "pp2_tp2_from_reference4")
# one process, one after another (`reference_packed`: the packed-document data of `cp2_packed`)
REFERENCES = ("reference", "moe_reference", "reference4", "reference6", "reference_muon", "reference_packed",
              "moe_mixtral_reference", "moe_reference3", "moe_reference3_short", "demo_reference",
              "mtp_reference", "gpt2_reference", "glm4_reference", "qwen2_moe_reference", "glm4_moe_reference")
# Issue 30 (test_zoo_parity.py): DeepSeek-V3's multi-token prediction under EP2 and PP2, and one
# multi-rank layout of each new model family, in the shared 2-rank launch.
ZOO_CASES = ("mtp_ep2", "mtp_pp2", "mtp_tp2", "gpt2_tp2", "glm4_tp2", "qwen2_moe_ep2", "glm4_moe_ep2")
# Context parallelism through the Trainer: every method, CP x FSDP, CP x TP and packed documents.
CP_TRAINER2_CASES = ("cp2", "cp2_ulysses", "cp2_packed")
CP_TRAINER4_CASES = ("cp2_fsdp2", "cp2_tp2", "cp4_hybrid")
# `moe_ep2_from_moe_ep4_deredundancy` continues the 4-rank launch's EP4 checkpoint under EP2 (a cheap
# 2-step case here rather than a 4-rank one there): the world2 fixture runs after world4.
WORLD2_CASES = ("fsdp2", "tp2", "tp2_rcomm", "fsdp2_swap", "fsdp2_accum_mean", *CP_TRAINER2_CASES, "moe_fsdp2", "moe_ep2",
                "moe_ep2_from_moe_ep4_deredundancy", "moe_mixtral_ep2", "moe_tp2", "moe_cp2", "moe_cp2_ep2", "fsdp2_muon",
                "fsdp2_muon_from_reference_muon", *PIPELINE2_CASES, "moe_pp2", *DEMO_PIPELINE_CASES, *ZOO_CASES)
WORLD4_CASES = ("hsdp2x2", "fsdp2_tp2", "fsdp2_tp2_from_reference", *CP_TRAINER4_CASES,
                *PIPELINE4_CASES, "moe_ep4_deredundancy", "moe_ep2_fsdp2", "moe_ep2_tp2", "moe_pp2_ep2", "moe_pp2_tp2")
# The 8-rank launch (_trainer_worker.py alone): the seed's parallelism example scaled down, TP2 x PP2 x
# EP2 over FSDP2 with alltoall_deredundancy and both overlap flags (test_moe_parity.py).
WORLD8_CASES = ("moe_seed_layout",)
# Context parallelism (_cp_worker.py): attention Cells first, then these model cases, at the end of
# the 2- and 4-rank launches (after their Trainer cases: no msrun start-up of their own).
# The tiny llama's CP layouts (colossal, ulysses, hybrid, x TP, x FSDP, packed) are proven through
# the Trainer (CP_TRAINER*_CASES: STEPS steps of losses, norms and weights), so the model-level launches
# keep what the Trainer cases do not cover: qwen3's q/k norms under each method (the ring on packed
# documents with async, Ulysses x TP, hybrid on packed documents), deepseek_v3's MLA with the
# dense reset_attention_mask. All PyNative: the compiled ring is the Trainer's cp2 step (a compiled
# model case here cost ~300 s of graph compilation and proved nothing more).
CP_WORKER = HERE / "_cp_worker.py"
CP_WORLD2_CASES = ("qwen3_cp2_packed", "deepseek_v3_cp2_packed")
CP_WORLD4_CASES = ("qwen3_cp4_hybrid", "qwen3_cp2_tp2")


def write_corpus(prefix: Path) -> None:
    """A small Megatron corpus (vocab 64): documents of noisy arithmetic sequences, EOD = 1."""
    import mf_data

    prefix.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.RandomState(0)
    builder = mf_data.IndexedDatasetBuilder(mf_data.get_bin_path(str(prefix)), dtype=np.uint16)
    for _ in range(60):
        start, length = rng.randint(0, 60), rng.randint(20, 80)
        tokens = (start + np.arange(length) * 3 + rng.randint(0, 3, length)) % 61 + 2
        builder.add_item(np.append(tokens, 1).astype(np.uint16))
        builder.end_document()
    builder.finalize(mf_data.get_idx_path(str(prefix)))


def write_demo_corpus(cache: Path) -> None:
    """The README demo's data, made as the demo makes it (mf-data: Python's pydoc topics, a
    2000-piece sentencepiece model, EOD appended): `pydoc_text_document.{bin,idx}` and
    `pydoc_spm.model` in `cache`, built once before the ranks read it."""
    import io

    import mf_data

    cache.mkdir(parents=True, exist_ok=True)
    info = mf_data.make_demo_corpus(str(cache))
    mf_data.train_sentencepiece([info["path"]], str(cache / "pydoc_spm.model"), 2000)
    mf_data.preprocess([info["path"]], str(cache / "pydoc_spm.model"), str(cache / "pydoc"), append_eod=True,
                       workers=1, overwrite=True, progress=False, log=io.StringIO())


def toy_train_dataset(workdir: Path) -> dict:
    """The YAML `train_dataset` section over `write_corpus`'s corpus in `workdir` (seq 16)."""
    return {"dataloader": {
        "type": "BlendedMegatronDatasetDataLoader", "datasets_type": "GPTDataset", "sizes": [200, 0, 0],
        "column_names": ["input_ids", "labels", "loss_mask", "position_ids"],
        "config": {"seq_length": 16, "split": "1,0,0", "eod": 1, "pad": 0, "create_attention_mask": False,
                   "data_path": ["1", str(workdir / "data" / "toy_text_document")]}},
        "num_parallel_workers": 1}


def run_one_process(workdir: Path, *cases: str) -> subprocess.CompletedProcess:
    """`_trainer_worker.py` as a plain process (world size 1: the reference)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MS_WORKER_NUM", "RANK_SIZE", "WORLD_SIZE")}
    return subprocess.run([sys.executable, str(TRAINER_WORKER), str(workdir), *cases], capture_output=True,
                          text=True, env={**env, "GLOG_v": "3"}, timeout=600)


