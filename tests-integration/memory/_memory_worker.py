"""One memory case of the real Trainer, its estimate beside its measured peak.

Usage: _memory_worker.py WORKDIR CASE   (one process; under msrun every rank runs it)

Trains STEPS steps of a small llama in PyNative mode (GRAPH_MODE's compile holds far more host
memory than the step itself on CPU: 2.6 GB against 1.0 GB measured for the `none` case) and
writes `WORKDIR/CASE/rank_<r>.json`: `peak` (the process's VmHWM at the end, bytes), `estimate`
(mf_trainer.memory_plan's total for this rank's pipeline stage), the estimate's parts, and
`held`: the bytes of the parameters and AdamW moments this rank's Trainer really stores.
`idle` is the same run with a minuscule model (hidden 8, one layer, the same vocabulary, 8-token
sequences): its peak is the framework's own footprint (interpreter, MindSpore's runtime and
kernels, the data loader), subtracted from every case's peak of the same world size.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

STEPS = 2
VOCAB = 2000
SEQ = 256
BATCH = 8

# name -> (parallelism, recompute, world)
CASES = {
    "idle": ({}, {"mode": "None"}, 1),
    "none": ({}, {"mode": "None"}, 1),
    "full": ({}, {"mode": "full", "full_recompute_layer": ["0-3"]}, 1),
    "select": ({}, {"mode": "select", "select_module": {"attention": ["0-3"], "feed_forward": ["0-1"]}}, 1),
    "idle2": ({}, {"mode": "None"}, 2),
    "fsdp2": ({}, {"mode": "None"}, 2),
    "tp2": ({"tensor_parallel": 2}, {"mode": "None"}, 2),
    "tp2_rcomm": ({"tensor_parallel": 2}, {"mode": "None"}, 2),     # + RECOMPUTE_COMM below
    "moe": ({}, {"mode": "None"}, 1),          # DEEPSEEK below: MLA, routed + shared experts
}
# recompute_comm of the tp2_rcomm case: both sequence-parallel gathers of every layer re-done in backward.
RECOMPUTE_COMM = {"tp2_rcomm": {"enable": True, "select_module": {"attention.qkv": ["0-3"], "feed_forward": ["0-3"]}}}
# A small DeepSeek-V3: layer 0 dense, layers 1-3 MoE (8 routed experts, top 2, one shared), MLA
# with both low-rank bottlenecks; the dispatcher's gathered weight blocks are a visible term.
DEEPSEEK = {"model_type": "deepseek_v3", "vocab_size": VOCAB, "hidden_size": 256, "intermediate_size": 688,
            "moe_intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 8,
            "num_key_value_heads": 8, "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 1,
            "topk_group": 1, "n_shared_experts": 1, "first_k_dense_replace": 1, "kv_lora_rank": 64,
            "q_lora_rank": 96, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32}


def write_corpus(prefix: str) -> None:
    import mf_data

    if os.path.exists(prefix + ".idx"):
        return
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    rng = np.random.RandomState(0)
    builder = mf_data.IndexedDatasetBuilder(mf_data.get_bin_path(prefix), dtype=np.uint16)
    for _ in range(120):
        builder.add_item(rng.randint(2, VOCAB, size=600).astype(np.uint16))
        builder.end_document()
    builder.finalize(mf_data.get_idx_path(prefix))


def raw_config(workdir: Path, name: str) -> dict:
    parallelism, recompute, world = CASES[name]
    idle = name.startswith("idle")
    seq, batch = (8, 1) if idle else (SEQ, BATCH)
    dp = world // parallelism.get("tensor_parallel", 1)
    model = ({"vocab_size": VOCAB, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
              "num_attention_heads": 2, "num_key_value_heads": 1} if idle else
             {"vocab_size": VOCAB, "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
              "num_attention_heads": 8, "num_key_value_heads": 4})
    return {
        "output_dir": str(workdir / name / "out"),
        "context": {"mode": 1},
        "checkpoint": {"enable_save": False},
        "training": {"steps": STEPS, "local_batch_size": batch, "global_batch_size": batch * dp, "seed": 1},
        "optimizer": {"type": "AdamW"},
        "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1e-3},
        "train_dataset": {"dataloader": {
            "type": "BlendedMegatronDatasetDataLoader", "datasets_type": "GPTDataset", "sizes": [64, 0, 0],
            "column_names": ["input_ids", "labels", "loss_mask", "position_ids"],
            "config": {"seq_length": seq, "split": "1,0,0", "eod": 1, "pad": 0, "create_attention_mask": False,
                       "data_path": ["1", str(workdir / "data" / "toy_text_document")]}},
            "num_parallel_workers": 1},
        "model": {"max_position_embeddings": SEQ, **(DEEPSEEK if name == "moe" else {"model_type": "llama", **model})},
        "parallelism": parallelism,
        "recompute": recompute,
        **({"recompute_comm": RECOMPUTE_COMM[name]} if name in RECOMPUTE_COMM else {}),
        "monitor": {"tensorboard": False},
    }


def peak_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def main(workdir: Path, name: str) -> None:
    import mf_config
    from mf_trainer import Trainer, memory_plan

    world = CASES[name][2]
    if world == 1:
        write_corpus(str(workdir / "data" / "toy_text_document"))   # multi-rank: the launcher's caller writes it
    cfg = mf_config.load_config(raw_config(workdir, name))
    trainer = Trainer(cfg)
    trainer.train()
    rank = trainer.parallel.rank
    plan = memory_plan(cfg, trainer.layout)     # the layout the run itself resolved
    mine = plan.ranks[0]
    out = workdir / name
    out.mkdir(parents=True, exist_ok=True)
    opt = trainer.optimizer
    held = {  # what this rank really stores, to compare with the estimate's exact parts
        "parameters": sum(p.size * p.itemsize for p in trainer.model.get_parameters()),   # trained or not
        "optimizer": sum(m.size * m.itemsize for m in (*opt.exp_avg, *opt.exp_avg_sq)),
    }
    (out / f"rank_{rank}.json").write_text(json.dumps({
        "peak": peak_rss(), "estimate": mine.total, "held": held,
        "parts": {k: getattr(mine, k) for k in ("parameters", "gradients", "optimizer", "activations", "transient",
                                               "fsdp_gathered")}}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
