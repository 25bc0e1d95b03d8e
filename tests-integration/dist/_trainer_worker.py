"""The real Trainer on the tiny llama, one case after another in one process (one msrun launch per
world size), or alone as the one-process reference.

Usage: _trainer_worker.py WORKDIR CASE [CASE ...]
  WORKDIR holds `data/toy_text_document.{bin,idx}` (written by the test) and gets one directory per
  case: rank 0 writes `result.json` (per-step losses and grad norms, comm volume, mode) and
  `weights.npz` (the final weights, gathered from every shard).

Cases (see CASES): a parallel layout trains STEPS steps from the same seed on the same global
batch as the reference and saves a checkpoint at step STEPS; `reference` is the one-process run
(it also continues MORE = 2 steps from its own checkpoint). The checkpoint cases continue 2 steps from a
checkpoint written under another layout: `*_from_reference` (one process -> FSDP2 x TP2),
`reference_from_fsdp2_tp2` (FSDP2 x TP2 -> one process), `reference_from_cp2` (CP2 -> one
process), `moe_reference_from_moe_ep2` (EP2 -> one process, against
`moe_reference_from_moe_reference`), `moe_ep2_from_moe_ep4_deredundancy` (EP4 with the two-level
dispatcher -> EP2, against the same), `moe_reference3_from_moe_pp2` (MoE PP2 -> one process);
`reference_muon` and `fsdp2_muon` are the same with optimizer.type Muon.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

import mf_config
from _launches import toy_train_dataset
from mf_trainer import Callback, Trainer

# 4 steps (8 until the dist session's budget: every 4-rank case is PyNative on 2 shared cores, its
# time nearly proportional to its steps): the warm-up's 2 steps and 2 at the full learning rate, an
# evaluation after each pair and a checkpoint at the last.
STEPS = 4
MORE = 2                    # steps continued from a checkpoint
GLOBAL_BATCH = 4
SEED = 5
MAX_NORM = 0.5              # low enough that some steps are clipped (the test checks it: every step is, in 4)
# Adam amplifies rounding differences along the trajectory: at 2e-2 the one-process loss (fused
# LogSoftmax) and the vocab-parallel loss under TP (a distributed max/exp/sum; same maths, other
# rounding) reached 1.08e-5 relative in grad norm by step 8. At 1e-2 they stay well inside RTOL.
LR = 1e-2

# name -> (parallelism, training, context.mode requested, world). HSDP and FSDP x TP request
# GRAPH_MODE and must fall back to PyNative on CPU (two parallel axes: graph_mode_blocker).
CASES = {
    "reference": ({}, {"local_batch_size": 4}, 1, 1),
    "fsdp2": ({}, {"local_batch_size": 2}, 0, 2),
    "tp2": ({"tensor_parallel": 2}, {"local_batch_size": 4}, 0, 2),
    # recompute_comm (RECOMPUTE_COMM below): the selected sequence-parallel all-gathers redone in
    # backward. PyNative: the re-gathering bprop is the leaf machinery FSDP's reshard-after-forward
    # already compiles in fsdp2. Compiled, checked ad hoc: the same counts (+13 gathers, +5
    # reduce-scatters: the compiler neither merges nor prunes the backward gathers) and one-process
    # parity (losses 3.6e-7, norms 2.4e-7), in 207 s against 25 s here: it would prove nothing new.
    "tp2_rcomm": ({"tensor_parallel": 2}, {"local_batch_size": 4}, 1, 2),
    # swap (SWAP below) under FSDP2: the hooks are each rank's own, around FSDP's re-gathering
    # leaves and its PyNative gather prefetch. Requests GRAPH_MODE: swap trains in PyNative.
    "fsdp2_swap": ({}, {"local_batch_size": 2}, 0, 2),
    "fsdp2_accum_mean": ({"reshard_after_forward_policy": "always", "disable_gradient_division": False},
                         {"local_batch_size": 1}, 1, 2),
    "hsdp2x2": ({"data_parallel_shard": 2, "reshard_after_forward_policy": "never"}, {"local_batch_size": 1}, 0, 4),
    "fsdp2_tp2": ({"tensor_parallel": 2}, {"local_batch_size": 2}, 0, 4),
    # Context parallelism: both ranks read the same 4 samples and keep their zigzag chunks of each.
    "cp2": ({"context_parallel": 2}, {"local_batch_size": 4}, 0, 2),
    # The other methods and CP with a second axis, in PyNative (cp2 proves the compiled ring step;
    # graph mode here would add minutes of compilation and prove nothing new).
    "cp2_ulysses": ({"context_parallel": 2, "context_parallel_method": "ulysses"}, {"local_batch_size": 4}, 1, 2),
    "cp4_hybrid": ({"context_parallel": 4, "context_parallel_method": "hybrid", "ulysses_degree_in_cp": 2},
                   {"local_batch_size": 4}, 1, 4),
    # FSDP over dp_shard x cp = 4 ranks, 2 samples per data-parallel rank; loss summed over dp x cp.
    "cp2_fsdp2": ({"context_parallel": 2, "data_parallel_shard": 2}, {"local_batch_size": 2}, 1, 4),
    "cp2_tp2": ({"context_parallel": 2, "tensor_parallel": 2}, {"local_batch_size": 4}, 1, 4),
    # Packed documents (PACKED below): one process reads the dense block-diagonal mask, CP2 the
    # compressed EOD column (actual_seq_len) of the same samples, turned into global document ids.
    "reference_packed": ({}, {"local_batch_size": 4}, 1, 1),
    "cp2_packed": ({"context_parallel": 2}, {"local_batch_size": 4}, 1, 2),
    # MoE training (tiny DeepSeek-V3: balance loss, expert-bias update; see test_moe_parity.py)
    "moe_reference": ({}, {"local_batch_size": 4}, 1, 1),
    # PyNative: the compiled MoE step is proven in one process (mf-models' test_graph_mode) and the
    # compiled FSDP step by `fsdp2`; compiling this one cost ~100-230 s of the launch and proved nothing more.
    "moe_fsdp2": ({}, {"local_batch_size": 2}, 1, 2),
    # Expert parallelism: each of the 2 ranks holds 2 of the 4 experts (and half the other weights).
    # PyNative: a compiled step costs a second MoE graph compile (~300 s on a loaded machine, the
    # same as moe_fsdp2's) for a path moe_fsdp2 already compiles; EP2 compiled was checked ad hoc.
    "moe_ep2": ({"expert_parallel": 2}, {"local_batch_size": 2}, 1, 2),
    # The two-level dispatcher: EP4 in device groups of 2 ranks (1 expert each), so a token whose
    # 2 experts sit in the other group crosses once. PyNative, 1 sample per rank.
    "moe_ep4_deredundancy": ({"expert_parallel": 4, "moe_token_dispatcher_type": "alltoall_deredundancy",
                              "npu_nums_per_device": 2}, {"local_batch_size": 1}, 1, 4),
    # Expert data parallelism on 4 ranks: ep groups {0, 1} and {2, 3}; each expert block FSDP-sharded
    # over the 2 ranks holding it (dp_shard_mod_ep {0, 2}, {1, 3}), its gradient reduced there.
    "moe_ep2_fsdp2": ({"expert_parallel": 2}, {"local_batch_size": 1}, 1, 4),
    # A tiny Mixtral (MIXTRAL_MODEL: softmax top-2 router, no shared expert, transformers' switch
    # balance loss) under EP2, against one process reading the same 2-sample micro-batches (the
    # switch loss is a per-micro-batch statistic: 2 accumulated micro-batches of 2 samples).
    # EP2 x TP2 on 4 ranks: non-expert weights under the TP plan with SP, experts split over the 2
    # data-parallel ranks of each tp rank and replicated over tp (each tp rank routes its own
    # sequence shard: expert gradients all-reduced over tp, and its share of the balance loss taken
    # from the whole sequences' counts), the bias update on.
    "moe_ep2_tp2": ({"expert_parallel": 2, "tensor_parallel": 2}, {"local_batch_size": 2}, 1, 4),
    # Sequences split over ranks with the balance loss on (each rank's share from the whole
    # sequences' counts, summed over the ranks holding them): TP2 (sequence parallelism splits them
    # after the embedding), CP2 (zigzag chunks), and CP2 x EP2 (the ep ranks are the cp ranks: each
    # routes its own chunks' tokens through the exchange). PyNative, the 2-rank launch.
    "moe_tp2": ({"tensor_parallel": 2}, {"local_batch_size": 4}, 1, 2),
    "moe_cp2": ({"context_parallel": 2}, {"local_batch_size": 4}, 1, 2),
    "moe_cp2_ep2": ({"context_parallel": 2, "expert_parallel": 2}, {"local_batch_size": 4}, 1, 2),
    "moe_mixtral_reference": ({}, {"local_batch_size": 2}, 1, 1),
    "moe_mixtral_ep2": ({"expert_parallel": 2}, {"local_batch_size": 2}, 1, 2),
    # MoE pipeline stages (the 3-layer DeepSeek-V3 of moe_reference3: dense layer 0 and MoE layer 1 on
    # stage 0, MoE layer 2 on stage 1): each stage's balance loss in its own backward, the loads of
    # both stages' layers summed for the bias update; 4 micro-batches of 1 sample, PyNative.
    "moe_reference3": ({}, {"local_batch_size": 4}, 1, 1),
    # ... its first SHORT_STEPS steps alone (the final weights and expert biases of a short case).
    "moe_reference3_short": ({}, {"local_batch_size": 4}, 1, 1),
    "moe_pp2": ({"pipeline_parallel": 2, "pipeline_parallel_layers_per_stage": [2, 1]}, {"local_batch_size": 1}, 1, 2),
    # ... and each stage's experts split over its 2 data-parallel ranks (PP2 x EP2 on 4 ranks: the
    # non-expert weights FSDP-sharded over the pair, tokens exchanged by the all-to-all dispatcher
    # inside each stage); one micro-batch of 2 samples per data-parallel slice (moe_pp2 covers the
    # micro-batch sums; 2 micro-batches of 1 took twice as long: stage 0 recomputes each forward).
    "moe_pp2_ep2": ({"pipeline_parallel": 2, "pipeline_parallel_layers_per_stage": [2, 1], "expert_parallel": 2},
                    {"local_batch_size": 2}, 1, 4),
    # ... and the stages' layers under the TP plan (PP2 x TP2 on 4 ranks): each tp rank routes its
    # sequence shard and takes its share of its stage's balance loss from the whole sequences'
    # counts; 2 micro-batches of 2 samples.
    "moe_pp2_tp2": ({"pipeline_parallel": 2, "pipeline_parallel_layers_per_stage": [2, 1], "tensor_parallel": 2},
                    {"local_batch_size": 2}, 1, 4),
    # The seed's parallelism example (TP2 x PP2 x EP8 over FSDP at world 32, alltoall_deredundancy,
    # both overlap flags) scaled to 8 ranks: TP2 x PP2 x EP2 over FSDP2 on the 3-layer model. Device
    # groups of 1 rank (npu_nums_per_device 1, the only size below ep 2 that leaves level 1 an
    # exchange): a token crosses to the other ep rank once whichever of its experts live there, and
    # is fanned out to them there (level 2). 2 micro-batches of 1 sample per dp slice: the last stage
    # runs F0, [B0 F1], B1 (overlap_b_f's combined action).
    "moe_seed_layout": ({"pipeline_parallel": 2, "pipeline_parallel_layers_per_stage": [2, 1], "tensor_parallel": 2,
                         "expert_parallel": 2, "moe_token_dispatcher_type": "alltoall_deredundancy",
                         "npu_nums_per_device": 1, "pipeline_parallel_overlap_p2p": True,
                         "pipeline_parallel_overlap_b_f": True}, {"local_batch_size": 1}, 1, 8),
    # Pipeline parallelism on the 4-layer model (reference4): 4 micro-batches of 1 sample per step.
    "reference4": ({}, {"local_batch_size": 4}, 1, 1),
    "pp2_1f1b": ({"pipeline_parallel": 2}, {"local_batch_size": 1}, 1, 2),
    "pp2_gpipe": ({"pipeline_parallel": 2, "pipeline_parallel_schedule": "gpipe"}, {"local_batch_size": 1}, 1, 2),
    "pp2_interleaved": ({"pipeline_parallel": 2, "pipeline_parallel_interleave_num": 2}, {"local_batch_size": 1}, 0, 2),
    "pp2_1f1b_split": ({"pipeline_parallel": 2, "pipeline_parallel_enable_dxdw_split": True},
                       {"local_batch_size": 1}, 1, 2),
    "pp2_zbv": ({"pipeline_parallel": 2, "pipeline_parallel_schedule": "zbv"}, {"local_batch_size": 1}, 1, 2),
    # Pipeline stages x data / tensor parallelism on 4 ranks: each stage FSDP-sharded over its dp
    # group (2 micro-batches of 1 sample per dp slice), or its layers under the TP plan (2
    # micro-batches of 2: the step's cost is collective latency, per micro-batch).
    "pp2_fsdp2": ({"pipeline_parallel": 2}, {"local_batch_size": 1}, 1, 4),
    "pp2_tp2": ({"pipeline_parallel": 2, "tensor_parallel": 2}, {"local_batch_size": 2}, 1, 4),
    # The other schedules with sharded stages (4 ranks): two model chunks per rank with their own
    # FSDP units / TP leaves (interleaved x FSDP, zbv x both), the split backward's deferred weight
    # gradients reduce-scattered when W runs (FSDP) and on TP leaves (zbv splits its backward), the
    # V placement's loss and both uses of the tied table on one rank, and gpipe once.
    "pp2_gpipe_tp2": ({"pipeline_parallel": 2, "pipeline_parallel_schedule": "gpipe", "tensor_parallel": 2},
                      {"local_batch_size": 2}, 1, 4),
    "pp2_interleaved_split_fsdp2": ({"pipeline_parallel": 2, "pipeline_parallel_interleave_num": 2,
                                     "pipeline_parallel_enable_dxdw_split": True}, {"local_batch_size": 1}, 1, 4),
    "pp2_zbv_fsdp2": ({"pipeline_parallel": 2, "pipeline_parallel_schedule": "zbv"}, {"local_batch_size": 1}, 1, 4),
    "pp2_zbv_tp2": ({"pipeline_parallel": 2, "pipeline_parallel_schedule": "zbv", "tensor_parallel": 2},
                    {"local_batch_size": 2}, 1, 4),
    # DDP stages: each stage whole on both ranks of its dp pair, its gradients all-reduced over the
    # pair in every micro-batch's backward (2 micro-batches of 1 sample per dp slice, as pp2_fsdp2).
    "pp2_ddp2": ({"pipeline_parallel": 2, "data_parallel_shard_strategy": "no_shard"}, {"local_batch_size": 1}, 1, 4),
    "reference6": ({}, {"local_batch_size": 4}, 1, 1),
    "pp4_1f1b_uneven": ({"pipeline_parallel": 4, "pipeline_parallel_layers_per_stage": [1, 2, 2, 1]},
                        {"local_batch_size": 1}, 1, 4),
    # Issue 30's models and DeepSeek-V3's multi-token prediction (test_zoo_parity.py), SHORT_STEPS
    # steps each against their own one-process reference. MTP (MTP_MODEL: the 3-layer DeepSeek-V3
    # with one MTP module, its MoE block routed, its loss weighted 0.3): EP2 (the MTP block's experts
    # split with the decoder's) and PP2 (the MTP module and its table lookup on the last stage, 4
    # micro-batches of 1). The families: GPT-2 under TP2 (LayerNorms on sequence shards, the position
    # table vocab-parallel, the tied head untied), GLM-4 under TP2 (post norms, partial interleaved
    # rotary on the local heads), Qwen2-MoE and GLM-4.5 under EP2 (gated shared expert; -inf group
    # mask, q/k norms, the expert bias). PyNative: the compiled MoE and TP steps are proven above.
    "mtp_reference": ({}, {"local_batch_size": 4}, 1, 1),
    "mtp_ep2": ({"expert_parallel": 2}, {"local_batch_size": 2}, 1, 2),
    "mtp_pp2": ({"pipeline_parallel": 2, "pipeline_parallel_layers_per_stage": [2, 1]}, {"local_batch_size": 1}, 1, 2),
    # ... and TP2: the MTP module on sequence shards (its lookup of the shifted tokens vocab-parallel, its
    # norms and projection replicated, its block planned as the decoder's, its share of the balance loss
    # from the whole sequences' counts)
    "mtp_tp2": ({"tensor_parallel": 2}, {"local_batch_size": 4}, 1, 2),
    "gpt2_reference": ({}, {"local_batch_size": 4}, 1, 1),
    "gpt2_tp2": ({"tensor_parallel": 2}, {"local_batch_size": 4}, 1, 2),
    "glm4_reference": ({}, {"local_batch_size": 4}, 1, 1),
    "glm4_tp2": ({"tensor_parallel": 2}, {"local_batch_size": 4}, 1, 2),
    "qwen2_moe_reference": ({}, {"local_batch_size": 4}, 1, 1),
    "qwen2_moe_ep2": ({"expert_parallel": 2}, {"local_batch_size": 2}, 1, 2),
    "glm4_moe_reference": ({}, {"local_batch_size": 4}, 1, 1),
    "glm4_moe_ep2": ({"expert_parallel": 2}, {"local_batch_size": 2}, 1, 2),
    # Muon (MUON below): the FSDP shards of each matrix are gathered for Newton-Schulz.
    "reference_muon": ({}, {"local_batch_size": 4}, 1, 1),
    "fsdp2_muon": ({}, {"local_batch_size": 2}, 0, 2),
}
# The recompute_comm case's selection: the attention input's gather in both layers (by the
# seed's name and by MindFormers' norm name), the MLP input's in layer 1.
RECOMPUTE_COMM = {"tp2_rcomm": {"enable": True, "select_module": {"attention.qkv": ["0"], "attention_norm": ["1"],
                                                                   "feed_forward": ["1"]}}}
# The swap case's selection: layer 0 whole, layer 1's MLP by MindFormers' name.
SWAP = {"fsdp2_swap": {"enable": True, "layer_swap": [{"layers": ["0"]}], "op_swap": [{"op_name": "mlp", "layers": ["1"]}]}}
# Evaluation during training (eval_dataset) in the cases that compare it with one process: every
# EVAL_INTERVAL steps on the same EVAL_SAMPLES held-out samples (eval_iters batches of the case's
# local_batch_size), so the eval losses at steps 2 and 4 (mid-run and the last) compare across layouts. Kept to a few
# batches: the launch must not grow.
EVAL_INTERVAL = 2
EVAL_SAMPLES = 8
# Under EP2 (moe_ep2); EP2 x FSDP2's eval gave one process's too (3.8e-8, ad hoc: 16 one-sample
# batches through the exchange cost ~100 s of the 4-rank launch on a loaded machine).
EVAL_CASES = ("reference", "tp2", "cp2", "reference4", "pp2_1f1b", "pp2_fsdp2", "pp2_tp2", "moe_reference", "moe_ep2",
              "moe_reference3", "moe_pp2")
# Decoder layers per case (2 unless named): every virtual pipeline stage needs a layer.
LAYERS = {**{name: 4 for name in CASES if name.startswith("pp2")}, "reference4": 4, "reference6": 6,
          "pp4_1f1b_uneven": 6}
# The tiny DeepSeek-V3 of the moe_* cases: MLA, first layer dense, 4 experts in 2 groups, a shared
# expert, the sequence-wise balance loss on and the aux-loss-free bias update at 10x DeepSeek's rate.
MOE_MODEL = {"model_type": "deepseek_v3", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
             "max_position_embeddings": 32, "moe_intermediate_size": 16, "n_routed_experts": 4,
             "num_experts_per_tok": 2, "n_group": 2, "topk_group": 2, "n_shared_experts": 1,
             "first_k_dense_replace": 1, "kv_lora_rank": 16, "q_lora_rank": 24, "qk_nope_head_dim": 8,
             "qk_rope_head_dim": 4, "v_head_dim": 8, "aux_loss_alpha": 0.01, "seq_aux": True,
             "moe_router_bias_update_rate": 0.01}
MOE_LAYERS = {"moe_reference3": 3, "moe_reference3_short": 3, "moe_pp2": 3, "moe_pp2_ep2": 3, "moe_pp2_tp2": 3,
              "moe_seed_layout": 3}
# The 3-layer family's own seed: at seed 5 its layer-2 expert bias is back at zero after 4 steps (+-1
# sign steps that cancel), and the parity tests check that each bias moved. At 6 both MoE layers'
# biases have moved after 3 steps (SHORT_STEPS) and after 4 (STEPS), and the losses fall in both.
MOE3_SEED = 6
# Cases that train fewer steps (8 ranks on 2 cores cost ~15 s a step, loaded), each against a
# one-process reference of the same length: 3 steps (at most STEPS), the first at the full learning
# rate, after which both MoE layers' expert biases have moved (MOE3_SEED).
SHORT_STEPS = 3
ZOO = ("mtp", "gpt2", "glm4", "qwen2_moe", "glm4_moe")       # issue 30's cases: <family>_<layout>
SHORT = ("moe_seed_layout", "moe_reference3_short",
         *(name for name in CASES if name.startswith(tuple(f"{z}_" for z in ZOO))))
# Their models (tiny, the sizes of MOE_MODEL).
MTP_MODEL = {**MOE_MODEL, "num_hidden_layers": 3, "num_nextn_predict_layers": 1, "mtp_loss_scaling_factor": 0.3}
ZOO_MODELS = {
    "mtp": MTP_MODEL,
    "gpt2": {"model_type": "gpt2", "vocab_size": 64, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 32,
             "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
    "glm4": {"model_type": "glm4", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
             "max_position_embeddings": 32},
    "qwen2_moe": {"model_type": "qwen2_moe", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
                  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "max_position_embeddings": 32, "moe_intermediate_size": 16, "num_experts": 4,
                  "num_experts_per_tok": 2, "shared_expert_intermediate_size": 24, "mlp_only_layers": [0]},
    "glm4_moe": {"model_type": "glm4_moe", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
                 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                 "max_position_embeddings": 32, "moe_intermediate_size": 16, "n_routed_experts": 4,
                 "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "n_shared_experts": 1,
                 "first_k_dense_replace": 1, "use_qk_norm": True, "attention_bias": True,
                 "num_nextn_predict_layers": 0, "aux_loss_alpha": 0.01, "moe_router_bias_update_rate": 0.01},
}


def zoo_family(case: str) -> str | None:
    """The issue-30 family of a case name ("mtp", "gpt2", ...), or None."""
    return next((z for z in sorted(ZOO, key=len, reverse=True) if case.startswith(z + "_")), None)


def steps_of(case: str) -> int:
    return SHORT_STEPS if case in SHORT else STEPS        # a MoE layer on each pipeline stage
# The tiny Mixtral of the moe_mixtral_* cases: 4 experts, top-2 by softmax, no shared expert, the
# switch balance loss on (output_router_logits) at 10x transformers' default weight.
MIXTRAL_MODEL = {"model_type": "mixtral", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 32,
                 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                 "max_position_embeddings": 32, "num_local_experts": 4, "num_experts_per_tok": 2,
                 "output_router_logits": True, "router_aux_loss_coef": 0.01}
# The Muon cases' optimizer, and a model whose MLP matrices have an odd row count (33), so FSDP2
# pads them and the gather of the orthogonalised update must drop and restore the padding row.
MUON = {"type": "Muon", "weight_decay": 0.1, "momentum": 0.9}
# The references whose own-checkpoint continuation a test reads (reference6's and moe_reference's
# were computed and never read: 2 steps and a Trainer build each, dropped).
CONTINUED = ("reference", "reference4", "reference_muon")
MUON_MODEL = {"intermediate_size": 33}
# The packed-document cases' data switches: positions restart and attention stays within each
# document of the toy corpus (20..80-token documents in 16-token samples: most samples hold two).
PACKED_DATA = {"reset_position_ids": True, "reset_attention_mask": True}
PACKED = {"reference_packed": ({**PACKED_DATA, "create_attention_mask": True}, "attention_mask"),
          "cp2_packed": ({**PACKED_DATA, "create_compressed_eod_mask": True, "eod_pad_length": 8}, "actual_seq_len")}


# The README demo's cases (DEMO_PIPELINE_CASES): examples/tiny/train.yaml as written, with its data
# made beforehand in WORKDIR/demo_cache, 4 steps of its global batch of 16 in 4 micro-batches of 4
# (so every schedule has a steady state), PyNative everywhere (pipeline ranks run PyNative; so does
# the reference, for a like-for-like comparison), the end-of-training sample left out.
DEMO_YAML = Path(__file__).resolve().parents[2] / "examples" / "tiny" / "train.yaml"
DEMO_STEPS = 4
DEMO_SCHEDULES = {"demo_reference": {}, "demo_pp2_1f1b": {},
                  "demo_pp2_gpipe": {"pipeline_parallel_schedule": "gpipe"},
                  "demo_pp2_interleaved": {"pipeline_parallel_interleave_num": 2},
                  "demo_pp2_1f1b_split": {"pipeline_parallel_enable_dxdw_split": True},
                  "demo_pp2_zbv": {"pipeline_parallel_schedule": "zbv"}}


def demo_config(workdir: Path, name: str):
    cache = workdir / "demo_cache"
    out = workdir / name
    data = ["1", str(cache / "pydoc_text_document")]
    pipeline = {} if name == "demo_reference" else {"pipeline_parallel": 2, **DEMO_SCHEDULES[name]}
    overrides = [f"output_dir={out}", f"checkpoint.save_path={out / 'ckpt'}", "context.mode=1",
                 f"training.steps={DEMO_STEPS}", "training.local_batch_size=4",
                 f"train_dataset.dataloader.config.data_path={json.dumps(data)}",
                 f"eval_dataset.dataloader.config.data_path={json.dumps(data)}",
                 f"tokenizer.path={cache / 'pydoc_spm.model'}", "inference=null", "monitor.tensorboard=false",
                 *[f"parallelism.{key}={json.dumps(value)}" for key, value in pipeline.items()]]
    return mf_config.load_config(str(DEMO_YAML), overrides)


def train_dataset(workdir: Path, name: str) -> dict:
    section = toy_train_dataset(workdir)
    if name in PACKED:
        switches, column = PACKED[name]
        section["dataloader"]["config"].update(switches)
        section["dataloader"]["column_names"] = [*section["dataloader"]["column_names"], column]
    return section


def eval_section(workdir: Path, local_batch_size: int) -> dict:
    """The toy corpus's first EVAL_SAMPLES samples (another sampling seed than the training data's)."""
    dataloader = toy_train_dataset(workdir)["dataloader"]
    dataloader = {**dataloader, "sizes": [EVAL_SAMPLES, 0, 0], "config": {**dataloader["config"], "seed": 77}}
    return {"dataloader": dataloader, "num_parallel_workers": 1, "eval_interval": EVAL_INTERVAL,
            "eval_iters": EVAL_SAMPLES // local_batch_size}


def config(workdir: Path, name: str, steps: int | None = None, load_path: str | None = None, out: str | None = None):
    return mf_config.load_config(raw_config(workdir, name, steps, load_path, out))


def raw_config(workdir: Path, name: str, steps: int | None = None, load_path: str | None = None,
               out: str | None = None) -> dict:
    """Case `name`'s YAML as plain data (test_multinode.py writes it to a file for `mf launch`)."""
    base = name.split("_from_")[0]
    steps = steps_of(base) if steps is None else steps
    parallelism, training, mode, _ = CASES[base]
    if load_path is not None:
        mode = 1    # continuations test the checkpoint, not a second compile of a graph their base proved
    muon = base.endswith("_muon")
    out_dir = workdir / (out or name)
    evaluated = name in EVAL_CASES and out is None      # not the continuations
    raw = {
        "output_dir": str(out_dir),
        "context": {"mode": mode},
        "checkpoint": {"save_path": str(out_dir / "ckpt"), "save_interleaved_steps": STEPS, "save_max": 3,
                       "remove_redundancy": True, **({"load_path": load_path} if load_path else {})},
        "training": {"steps": steps, "global_batch_size": GLOBAL_BATCH, "max_norm": MAX_NORM,
                     "seed": MOE3_SEED if base in MOE_LAYERS else SEED, **training},
        "optimizer": MUON if muon else {"type": "AdamW", "weight_decay": 0.1},
        "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": LR, "warmup_steps": 2},
        "parallelism": parallelism,
        "train_dataset": train_dataset(workdir, base),
        "model": ZOO_MODELS[zoo_family(base)] if zoo_family(base)
        else MIXTRAL_MODEL if base.startswith("moe_mixtral")
        else {**MOE_MODEL, "num_hidden_layers": MOE_LAYERS.get(base, 2)} if base.startswith("moe_") else {
            "model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": LAYERS.get(base, 2), "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 32, "tie_word_embeddings": True, "attention_bias": True,
            **(MUON_MODEL if muon else {})},
        "monitor": {"peak_flops_per_device": 1e11, "tensorboard": False,
                    "train_state": {"local_loss": True, "device_loss": True, "device_norm": True,
                                    "local_norm": "."}},     # every parameter's own norm: one vector all-reduce
    }
    if base in RECOMPUTE_COMM:
        raw["recompute_comm"] = RECOMPUTE_COMM[base]
    if base in SWAP:
        raw["swap"] = SWAP[base]
    if evaluated:
        raw["eval_dataset"] = eval_section(workdir, training["local_batch_size"])
    return raw


class Recorder(Callback):
    """The per-step metrics (every rank computes them; rank 0 writes them)."""

    def __init__(self) -> None:
        self.records: list[dict] = []

        self.evaluations: list[dict] = []

    def on_step_end(self, trainer, metrics):
        self.records.append(metrics)

    def on_evaluate(self, trainer, metrics):
        self.evaluations.append(metrics)


def run(workdir: Path, name: str) -> None:
    start = time.monotonic()
    recorder = Recorder()
    if "_from_" in name:                       # continue MORE steps from another layout's checkpoint
        base, source = name.split("_from_")
        cfg = config(workdir, name, STEPS + MORE, load_path=str(workdir / source / "ckpt"))
        continued = True
    elif name in DEMO_SCHEDULES:
        cfg = demo_config(workdir, name)
        continued = False
    else:
        cfg = config(workdir, name)
        continued = False
    trainer = Trainer(cfg, callbacks=[recorder])
    result = trainer.train()
    full = trainer.full_state()
    rank0 = trainer.parallel.is_rank0
    out = Path(cfg.output_dir)
    summary = {"name": name, "losses": result.losses, "grad_norms": [r["grad_norm"] for r in recorder.records],
               "mode": trainer.mode, "start_step": trainer.state.start_step, "dims": trainer.parallel.dims.describe(),
               "comm": recorder.records[1].get("comm") if len(recorder.records) > 1 else None,
               "metrics_keys": sorted(recorder.records[0]) if recorder.records else [],
               "param_norms": {key[len("grad_norm/"):]: [r[key] for r in recorder.records]
                               for key in (recorder.records[0] if recorder.records else ()) if key.startswith("grad_norm/")},
               "moe": {key: [r[key] for r in recorder.records] for key in ("moe/aux_loss", "moe/max_imbalance")
                       if recorder.records and key in recorder.records[0]},
               "mtp": {key: [r[key] for r in recorder.records] for key in ("mtp/loss", "mtp/loss_1")
                       if recorder.records and key in recorder.records[0]},
               "step_times": [r["step_time_s"] for r in recorder.records], "seconds": time.monotonic() - start,
               "swap": trainer.offload.stats.snapshot() if trainer.offload is not None else None,
               "evaluations": [{k: e[k] for k in ("step", "eval_loss", "eval_accuracy", "eval_tokens", "eval_batches",
                                                  "eval_time_s")} for e in recorder.evaluations]}
    if trainer.pipeline is not None:          # the executor's view of the last step
        last = trainer.runner.last
        summary["pipeline"] = {"compute": last.compute_seconds, "comm": last.comm_seconds, "span": last.span_seconds,
                               "idle": last.idle_seconds, "schedule": trainer.pipeline.spec.describe()}
    if name in CONTINUED and rank0:          # ... and the one-process continuation of its own checkpoint
        cont = Trainer(config(workdir, name, STEPS + MORE, load_path=str(out / "ckpt"), out=f"{name}_cont")).train()
        summary["continued"] = cont.losses
    if rank0:
        out.mkdir(parents=True, exist_ok=True)
        np.savez(out / "weights.npz", **full)
        (out / "result.json").write_text(json.dumps(summary))
    print(f"CASE {name} rank {trainer.parallel.rank} done in {time.monotonic() - start:.1f}s "
          f"(continued={continued})", flush=True)


def main(argv: list[str]) -> None:
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s", stream=sys.stdout)
    workdir = Path(argv[0])
    for name in argv[1:]:
        run(workdir, name)


if __name__ == "__main__":
    main(sys.argv[1:])
