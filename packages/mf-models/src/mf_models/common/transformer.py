"""The decoder-only skeleton every model shares: embed -> blocks -> norm -> output projection.

A model folder supplies its block class; this module owns the forward signature, the causal mask,
positions, tied/untied output, seeded initialisation and the FLOPs count. Positions reach the
blocks as rotary tables (`rope_dim` > 0) and the embedding (`embed`: a model with learned
positions, GPT-2, adds them there; its blocks get cos = sin = None).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from .args import BaseArgs
from .attention import causal_mask
from .balancing import BalanceSpec, WholeSequences, balance_loss
from .layers import Embedding, LayerNorm, Linear, RMSNorm, linear, resolve_compute_dtype, resolve_params_dtype
from .moe import GroupedExperts
from .mtp import MTPModule, run_mtp
from .rope import RotaryEmbedding, rope_frequencies
from .router import TopKRouter


def run_blocks(blocks, h, cos, sin, mask, cache):
    """Decoder blocks in order: (hidden states, and per MoE block its tokens per expert, dispatch
    counts, balance-loss counts and score sums, as lists). The whole model's trunk and a pipeline
    chunk's run the same loop."""
    loads, counts, aux_counts, aux_sums = [], [], [], []
    for block in blocks:
        if block.moe_enabled:
            h, load, count, aux_count, aux_sum = block(h, cos, sin, mask, cache)
            loads.append(load)
            counts.append(count)
            aux_counts.append(aux_count)
            aux_sums.append(aux_sum)
        else:
            h = block(h, cos, sin, mask, cache)
    return h, loads, counts, aux_counts, aux_sums


class CausalLM(nn.Cell):
    """`model(input_ids, position_ids=None, attention_mask=None) -> logits [B, S, V] float32`;
    `model.forward_train(...)` adds the balance loss and the routing statistics (see there).

    - input_ids [B, S] int.
    - position_ids [B, S] int, default 0..S-1 (after the cached length when a KV cache is given);
      Megatron's reset_position_ids packing just passes restarting positions.
    - attention_mask: Megatron convention, bool/int [B, 1, S, S] (or broadcastable), True/1 = masked
      out; OR-ed with the causal mask (e.g. reset_attention_mask's block-diagonal causal mask).
    - cache: a `KVCache` (used by `generate`; works eagerly and compiled), or any Cell with its
      protocol: `begin(seq)` -> query positions, `causal_mask(query_positions, attention_mask)`,
      `update(layer_id, k, v)` -> keys/values to attend over (the slot views of
      `mf_models.inference` keep one sequence per batch row at its own position).
    """

    def __init__(self, args: BaseArgs, rope_dim: int, make_block: Callable[[int, ms.Type, ms.Type], nn.Cell],
                 mtp_layers: int = 0):
        super().__init__()
        self.args = args
        self.compute_dtype = resolve_compute_dtype(args.compute_dtype)
        self.params_dtype = resolve_params_dtype(args.params_dtype)
        pdt, cdt = self.params_dtype, self.compute_dtype
        self.tok_embeddings = Embedding(args.vocab_size, args.hidden_size, pdt, args.pad_token_id)
        self.layers = nn.CellList([make_block(i, cdt, pdt) for i in range(args.num_hidden_layers)])
        if mtp_layers:
            # Multi-token prediction (common/mtp.py): blocks numbered after the decoder's, as HF stores them.
            self.mtp = nn.CellList([MTPModule(args, make_block(args.num_hidden_layers + k, cdt, pdt), pdt, cdt)
                                    for k in range(mtp_layers)])
            # its lookups of the shifted tokens: a leaf sharing the token table (one Parameter)
            table = self.tok_embeddings.weight
            self.mtp_embeddings = Embedding(args.vocab_size, args.hidden_size, pdt)
            self.mtp_embeddings.weight = table
            table.name = "tok_embeddings.weight"   # attaching renamed it with the attribute prefix
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps, pdt)
        self.tie_word_embeddings = args.tie_word_embeddings
        if not self.tie_word_embeddings:
            self.output = Linear(args.hidden_size, args.vocab_size, False, pdt, cdt)
        # rope_dim 0: no rotary embedding (learned positions, added by `embed`)
        self.rope = RotaryEmbedding(*rope_frequencies(args.rope, rope_dim, args.max_position_embeddings)) \
            if rope_dim else None
        # MoE models set these (see common/balancing.py); the statistics of `forward_train` need them.
        self.balance = BalanceSpec()
        self.num_experts = 0
        self.top_k = 0
        self.sequences = WholeSequences()     # a plan splitting sequences over ranks replaces it

    def construct(self, input_ids, position_ids=None, attention_mask=None, cache=None):
        return self.head(self.hidden_states(input_ids, position_ids, attention_mask, cache))

    def hidden_states(self, input_ids, position_ids=None, attention_mask=None, cache=None):
        """The final-norm hidden states [B, S, H]: `construct` without the output projection, for
        callers that need the logits of a few positions only (generation's last position)."""
        return self.trunk(input_ids, position_ids, attention_mask, cache, False)[0]

    def forward_train(self, input_ids, position_ids=None, attention_mask=None):
        """The training forward: `(logits, aux_loss, tokens_per_expert, dispatch_counts)`.

        - logits [B, S, V] float32, as `construct`.
        - aux_loss [] float32: the model's balance loss for this forward, already weighted
          (`aux_loss_alpha` / `router_aux_loss_coef`), to add to the language-model loss; 0 for
          dense models and when the model trains without one.
        - tokens_per_expert [L, E] float32: assignments per expert of each of the L MoE layers
          (`moe_layer_ids()`), not differentiated: the aux-loss-free bias update
          (`update_expert_bias`) and the MoE monitor. [0, 1] for dense models.
        - dispatch_counts [L, 2] float32: per MoE layer (dropped assignments, padding rows).
        All tensors, so the same call works in PyNative and inside a compiled GRAPH_MODE step
        (e.g. `ms.value_and_grad(loss_fn, None, weights, has_aux=True)`); `RoutingStats` turns the
        last two into metrics on the host.
        """
        h, aux, load, counts = self.forward_train_hidden(input_ids, position_ids, attention_mask)
        return self.head(h), aux, load, counts

    def forward_train_hidden(self, input_ids, position_ids=None, attention_mask=None):
        """`forward_train` before the output projection: `(hidden states [B, S, H] after the final
        norm, aux_loss, tokens_per_expert, dispatch_counts)`. A loss fused with the projection
        (mf_parallel.LinearCrossEntropy) takes `head_terms(hidden states)` instead of the logits."""
        return self.trunk(input_ids, position_ids, attention_mask, None, True)

    def trunk(self, input_ids, position_ids, attention_mask, cache, train):
        """(hidden states after the final norm, aux_loss, tokens_per_expert, dispatch_counts); `train`
        is a Python constant (the statistics are built only when it is True, None otherwise)."""
        positions, mask = self.positions_and_mask(input_ids, position_ids, attention_mask, cache)
        cos, sin = self.rotary(positions)
        h = self.embed(input_ids, positions)
        h, loads, counts, aux_counts, aux_sums = run_blocks(self.layers, h, cos, sin, mask, cache)
        h = self.norm(h)
        if not train:
            return h, None, None, None
        if not loads:
            return h, ops.zeros((), ms.float32), ops.zeros((0, 1), ms.float32), ops.zeros((0, 2), ms.float32)
        return h, self.balance_share(input_ids, aux_counts, aux_sums), ops.stack(loads), ops.stack(counts)

    def forward_train_mtp(self, input_ids, position_ids=None, attention_mask=None):
        """The training forward of a model built with multi-token prediction (common/mtp.py):
        `(hidden states [B, S, H] after the final norm, (h_1, ..., h_D) the MTP depths' hidden
        states after their norms, aux_loss, tokens_per_expert, dispatch_counts)`; the routing
        statistics have the MoE rows of `moe_layer_ids()` (decoder, then MTP blocks). The loss
        takes `head` (or the fused projection) of each."""
        positions, mask = self.positions_and_mask(input_ids, position_ids, attention_mask, None)
        cos, sin = self.rotary(positions)
        h = self.embed(input_ids, positions)
        h, loads, counts, aux_counts, aux_sums = run_blocks(self.layers, h, cos, sin, mask, None)
        h = self.norm(h)
        mtp_h, loads, counts, aux_counts, aux_sums = run_mtp(self.mtp_embeddings, self.compute_dtype, self.mtp,
                                                             input_ids, h, cos, sin, mask, loads, counts, aux_counts,
                                                             aux_sums)
        if not loads:
            return h, mtp_h, ops.zeros((), ms.float32), ops.zeros((0, 1), ms.float32), ops.zeros((0, 2), ms.float32)
        return h, mtp_h, self.balance_share(input_ids, aux_counts, aux_sums), ops.stack(loads), ops.stack(counts)

    @property
    def mtp_depth(self) -> int:
        """Multi-token-prediction modules built (0: none; `build_model(..., mtp=True)` builds them)."""
        return len(self.mtp) if hasattr(self, "mtp") else 0

    def balance_share(self, input_ids, aux_counts, aux_sums):
        """The balance loss of the MoE layers whose per-sequence counts / score sums are listed
        ([B, E] each), weighted: this rank's share when ranks split the sequences (`sequences`)."""
        seq = input_ids.shape[1] * self.sequences.seq_parts
        return balance_loss(self.balance, self.num_experts, self.top_k, seq, self.sequences(ops.stack(aux_counts)),
                            ops.stack(aux_sums))

    def moe_layer_ids(self) -> list[int]:
        """Decoder layers with a routed MoE (the rows of `forward_train`'s statistics), then the
        MoE blocks of the multi-token-prediction modules, numbered after the decoder's layers
        (num_hidden_layers + k, as HF's checkpoints store them; `forward_train_mtp`'s rows)."""
        ids = [i for i, layer in enumerate(self.layers) if layer.moe_enabled]
        n = len(self.layers)
        return ids + [n + k for k in range(self.mtp_depth) if self.mtp[k].moe_enabled]

    def rotary_and_mask(self, input_ids, position_ids=None, attention_mask=None, cache=None):
        """(cos, sin, mask) every decoder block takes, from the batch's ids, positions and mask (a
        pipeline stage computes them for its own blocks: only hidden states travel between stages)."""
        positions, mask = self.positions_and_mask(input_ids, position_ids, attention_mask, cache)
        cos, sin = self.rotary(positions)
        return cos, sin, mask

    def positions_and_mask(self, input_ids, position_ids=None, attention_mask=None, cache=None):
        """(position ids [B, S], mask): the given positions or 0..S-1 (after the cached length when a
        KV cache is given), and the causal mask OR-ed with `attention_mask`."""
        batch, seq = input_ids.shape
        if cache is None:
            query_positions = ops.arange(0, seq, dtype=ms.int32)
            mask = causal_mask(seq, seq, attention_mask)
        else:
            query_positions = cache.begin(seq)
            mask = cache.causal_mask(query_positions, attention_mask)
        if position_ids is None:
            position_ids = ops.broadcast_to(query_positions.reshape(1, seq), (batch, seq))
        return position_ids, mask

    def rotary(self, position_ids):
        """cos, sin [B, S, rope_dim] of the positions (None, None without a rotary embedding)."""
        if self.rope is None:
            return None, None
        return self.rope(position_ids)

    def embed(self, input_ids, position_ids):
        """The blocks' input [B, S, H] in the compute dtype: the token embeddings (a model with
        learned positions adds its position embeddings here)."""
        return self.tok_embeddings(input_ids).astype(self.compute_dtype)

    def head(self, h):
        """Logits (float32) of hidden states [..., H]."""
        if self.tie_word_embeddings:
            logits = linear(h, self.tok_embeddings.weight.astype(self.compute_dtype))
        else:
            logits = self.output(h)
        return logits.astype(ms.float32)

    def head_terms(self, h):
        """The output projection of hidden states [..., H] as linear terms, `((x, w), ...)` with
        logits = sum x w^T (float32 after): what a loss fused with the projection takes
        (mf_parallel.LinearCrossEntropy, mf-trainer's MaskedLMLoss) instead of the logits. The
        `output` Linear's own terms (a planned one's input and weight slice, a LoRA adapter's second
        term), or the embedding table when the embeddings are tied. See `head_terms_problem`."""
        if self.tie_word_embeddings:
            return ((h.astype(self.compute_dtype), self.tok_embeddings.weight.astype(self.compute_dtype)),)
        return self.output.linear_terms(h)

    def head_trained(self) -> tuple[bool, ...]:
        """Whether each of `head_terms`' weights needs its gradient (Python, before compiling)."""
        if self.tie_word_embeddings:
            return (bool(self.tok_embeddings.weight.requires_grad),)
        return self.output.linear_terms_trained()

    def head_terms_problem(self) -> str | None:
        """Why `head_terms` cannot stand in for `head` (None when it can): an output layer with a
        bias, or a parallel plan that transforms the projection's output."""
        if self.tie_word_embeddings:
            return None
        if getattr(self.output, "bias", None) is not None:
            return "the output projection has a bias"
        import mf_parallel as mp

        return mp.linear_terms_problem(self.output)

    def kv_cache_shapes(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """((key heads, key size), (value heads, value size)) of one layer's KV cache."""
        raise NotImplementedError(f"{type(self).__name__} must define kv_cache_shapes (abstract in CausalLM)")

    # -- accounting -----------------------------------------------------------------------------
    def attention_flops_dims(self) -> tuple[int, int, int]:
        """(query heads, q.k head size, v head size) for the attention FLOPs term."""
        raise NotImplementedError(f"{type(self).__name__} must define attention_flops_dims (abstract in CausalLM)")

    def active_matmul_params(self) -> int:
        """Weights multiplied per token: every Linear (the output projection even when tied), and
        for MoE only the `num_experts_per_tok` routed experts a token visits. Embedding lookup,
        norms and biases are not matmuls and are left out."""
        total = 0
        for _, cell in self.cells_and_names():
            if isinstance(cell, Linear):
                total += cell.in_features * cell.out_features
            elif isinstance(cell, GroupedExperts):
                total += cell.active_params_per_token()
        if self.tie_word_embeddings:
            total += self.args.vocab_size * self.args.hidden_size
        return total

    def num_flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs per token, PaLM-style (Chowdhery et al. 2022, appendix B):
        6 N (forward 2N + backward 4N over the active matmul weights N) plus the attention scores
        and weighted sum, 6 * layers * heads * (d_qk + d_v) * seq_len (= PaLM's 12 L H Q T when
        d_qk = d_v = Q), without the causal halving, as PaLM and TorchTitan count it."""
        seq_len = seq_len or self.args.seq_length or self.args.max_position_embeddings
        heads, d_qk, d_v = self.attention_flops_dims()
        attention = 6 * self.args.num_hidden_layers * heads * (d_qk + d_v) * seq_len
        return 6 * self.active_matmul_params() + attention


def _rng(seed: int, name: str) -> np.random.Generator:
    # One stream per parameter name: a tensor's initial value does not depend on which other
    # tensors exist, so pipeline stages or a resharded model initialise identically.
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def init_weights(model: nn.Cell, seed: int = 0) -> None:
    """HF-style init from numpy (device independent): normal(0, initializer_range) for matmul
    weights, embeddings and routers, ones for norms, zeros for biases and the expert-score bias."""
    std = model.args.initializer_range
    done: set[int] = set()      # a Parameter two leaves share (the MTP lookup's table) is drawn once
    for cell_name, cell in model.cells_and_names():
        own = cell.parameters_dict(recurse=False) if hasattr(cell, "parameters_dict") else {}
        own = {n: p for n, p in own.items() if id(p) not in done}
        done.update(id(p) for p in own.values())
        # LoRA adapters (mf_models.lora) initialise themselves: A random, B zero.
        adapters = cell.adapter_parameters() if hasattr(cell, "adapter_parameters") else ()
        if adapters:
            cell.reset_adapter(seed, cell_name)
        for name, param in own.items():
            if any(param is a for a in adapters):
                continue
            shape = tuple(param.shape)
            if isinstance(cell, RMSNorm) or isinstance(cell, LayerNorm) and param is cell.weight:
                value = np.ones(shape, np.float32)
            elif isinstance(cell, (Linear, Embedding, GroupedExperts)) and param is not getattr(cell, "bias", None):
                value = _rng(seed, name).normal(0.0, std, shape).astype(np.float32)
                if isinstance(cell, Embedding) and cell.padding_idx is not None:
                    value[cell.padding_idx] = 0.0
            elif isinstance(cell, TopKRouter) or param is getattr(cell, "bias", None):
                value = np.zeros(shape, np.float32)
            else:
                raise TypeError(f"init_weights: no rule for parameter {name} of {type(cell).__name__}")
            param.set_data(Tensor(value, param.dtype))
