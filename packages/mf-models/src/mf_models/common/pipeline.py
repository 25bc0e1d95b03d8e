"""A CausalLM cut into pipeline stages: the model chunks one pipeline rank holds.

    layout = mf_parallel.StageLayout.build(spec, mf_config.pipeline_layer_placement(...))
    stage = pipeline_stage(model, layout, pp_rank)       # this rank's part of the model
    stage.chunks                                          # by local chunk index, for the executor
    mf_parallel.PipelineExecutor(schedule, stage.chunks, mesh["pp"], tied=stage.tied, tied_ranks=layout.tied_ranks)

`PipelineStage` holds every parameter of the rank under its global name (`layers.7.attention.wq.
weight`, `norm.weight`, ...): the optimizer, gradient clipping and checkpoints see one Cell with
the names of the whole model. Each `PipelineChunk` runs one virtual stage: the embedding on the
first, its decoder blocks, and the final norm plus the output head on the last; rotary tables and
the causal mask are computed on every stage from the micro-batch (only hidden states travel).

Tied embeddings: on the rank that holds both ends (ZB-V's rank 0, or one stage) the head uses the
embedding table itself. Otherwise the last stage gets its own copy of the table, with the same
name (`tok_embeddings.weight`) and value; the executor sums the two copies' gradients between
the two ranks after each backward (`tied`), so they take identical optimizer steps and stay equal.
The model definition itself is untouched.

MoE models (routed layers in some stages): `stage.train_routing(aux_weight)` makes every chunk
holding a routed layer return `(output, aux, tokens_per_expert, dispatch_counts)` (mf-parallel's
side outputs): `aux` is the balance loss of the chunk's own MoE layers for the micro-batch, times
`aux_weight`, which the executor adds to the step's objective and differentiates in that chunk's
backward; the routing counts [rows, E] / [rows, 2] are the chunk's rows (`chunk.moe_rows`) of the
whole model's `forward_train` statistics. This is exact for balance losses that are sums over
layers (DeepSeek-V3's sequence- and batch-wise ones, or none); transformers' switch loss pools
every layer's statistics before one product, so it cannot be split into stages and is refused.

Under a parallel plan (tensor parallelism, FSDP/DDP: `mf_models.parallelize_model` before the
cut) the chunks run the planned leaves as they are: FSDP gathers and reduce-scatters each stage's
parameters over its own data-parallel group, TP splits the stage's layers. The plan has already
given a tied model an `output` leaf sharing the table (`untie_output`), so the last stage keeps
that leaf (its weight is still `tok_embeddings.weight`, resliced and sharded like the
embedding): under TP it produces vocabulary-split logits, and the two stages' copies are still
`tied`. With sequence parallelism (`sequence_shards` = tp) the hidden states between stages are
the rank's sequence shard [B, S / tp, H].
"""

from __future__ import annotations

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from ..errors import ModelConfigError
from . import parallel as _parallel  # noqa: F401  (registers Linear's backward split, which the chunks defer)
from .layers import linear
from .mtp import run_mtp
from .transformer import run_blocks


class _Layers(nn.Cell):
    """Some decoder blocks of a model, each under its global index ("layers.7...")."""

    def __init__(self, layers, ids) -> None:
        super().__init__()
        self.ids = tuple(ids)
        for i in self.ids:
            self.insert_child_to_cell(str(i), layers[i])

    def blocks(self):
        return [self._cells[str(i)] for i in self.ids]


class _TiedTable(nn.Cell):
    """The last stage's copy of a tied embedding table (named like the table: tok_embeddings.weight)."""

    def __init__(self, table: Parameter) -> None:
        super().__init__()
        self.weight = Parameter(Tensor(table.asnumpy().copy(), table.dtype), name="weight",
                                requires_grad=table.requires_grad)


class PipelineChunk(nn.Cell):
    """One virtual stage of a CausalLM: `chunk(x, mb)` with `mb` a dict holding `input_ids`
    [B, S] (every stage reads its shape) and optionally `position_ids`, `attention_mask`; `x` the
    previous stage's hidden states (None on the first stage). Returns hidden states [B, S, H], or
    float32 logits [B, S, V] on the last stage (its final-norm hidden states when `head_output` is
    False: a loss fused with the projection takes `head_terms` of them); of a model built with
    multi-token prediction, a tuple of the model's and each MTP depth's (the modules run there)."""

    def __init__(self, model, info, parts: dict, sequence_shards: int = 1) -> None:
        super().__init__(auto_prefix=False)
        self.stage, self.first, self.last = info.stage, info.first, info.last
        # Multi-token prediction (a model built with `mtp`): its modules run on the last stage, after
        # the final norm; the chunk then returns (logits, the depths' logits...) (common/mtp.py).
        self.mtp_depth = len(parts["mtp"]) if self.last and "mtp" in parts else 0
        self.hidden_size = model.args.hidden_size
        self.sequence_shards = sequence_shards
        self.compute_dtype = model.compute_dtype
        object.__setattr__(self, "_model", model)          # for rotary tables and the mask (no parameters)
        if self.first:
            self.tok_embeddings = parts["tok_embeddings"]
        self.layers = _Layers(model.layers, info.layers)
        if self.last:
            self.norm = parts["norm"]
            if "output" in parts:
                self.output = parts["output"]
            else:
                # The table itself or the last stage's copy, under its own name (attaching a Cell
                # under another attribute would rename its parameter).
                self.tok_embeddings = parts["tok_embeddings"]
        object.__setattr__(self, "blocks", self.layers.blocks())
        moe_ids = model.moe_layer_ids()
        mine = [i for i in info.layers if i in moe_ids]
        if self.mtp_depth:
            self.mtp = parts["mtp"]
            self.mtp_embeddings = parts["mtp_embeddings"]
            n = model.args.num_hidden_layers
            mine += [n + k for k in range(self.mtp_depth) if n + k in moe_ids]
        # Rows of the whole model's routing statistics that this chunk's MoE layers produce.
        self.moe_rows = tuple(moe_ids.index(i) for i in mine)
        self.side_outputs = False           # set by PipelineStage.train_routing
        self.aux_weight = 1.0
        # False: the last stage returns the final-norm hidden states, for a loss fused with the
        # output projection (`head_terms`); `head` gives their logits.
        self.head_output = True

    def activation_spec(self, mb) -> tuple:
        batch, seq = mb["input_ids"].shape
        return (batch, seq // self.sequence_shards, self.hidden_size), self.compute_dtype

    def input_spec(self, mb) -> tuple:
        return self.activation_spec(mb)

    def output_spec(self, mb) -> tuple:
        return self.activation_spec(mb)

    def construct(self, x, mb):
        ids = mb["input_ids"]
        positions, mask = self._model.positions_and_mask(ids, mb.get("position_ids"), mb.get("attention_mask"))
        cos, sin = self._model.rotary(positions)
        h = self._model.embed(ids, positions) if self.first else x
        h, loads, counts, aux_counts, aux_sums = run_blocks(self.blocks, h, cos, sin, mask, None)
        if self.last:
            h = self.norm(h)
        if self.last and self.mtp_depth:
            mtp_h, loads, counts, aux_counts, aux_sums = run_mtp(self.mtp_embeddings, self.compute_dtype, self.mtp,
                                                                 ids, h, cos, sin, mask, loads, counts, aux_counts,
                                                                 aux_sums)
            out = (h,) + tuple(mtp_h)
            if self.head_output:
                out = tuple(self.head(x) for x in out)
        else:
            out = self.head(h) if self.last and self.head_output else h
        if not self.side_outputs:
            return out
        # The balance loss of this chunk's layers (a sum over layers: see the module doc).
        aux = self._model.balance_share(ids, aux_counts, aux_sums) * self.aux_weight
        return out, aux, ops.stack(loads), ops.stack(counts)

    def head(self, h):
        """Logits (float32) of final-norm hidden states (the last stage), as `CausalLM.head`."""
        if hasattr(self, "output"):
            return self.output(h).astype(ms.float32)
        # As CausalLM.head with tied embeddings (the head multiplies by the table).
        return linear(h, self.tok_embeddings.weight.astype(self.compute_dtype)).astype(ms.float32)

    def head_terms(self, h):
        """The last stage's output projection as linear terms, as `CausalLM.head_terms`."""
        if hasattr(self, "output"):
            return self.output.linear_terms(h)
        return ((h.astype(self.compute_dtype), self.tok_embeddings.weight.astype(self.compute_dtype)),)

    def head_trained(self) -> tuple[bool, ...]:
        if hasattr(self, "output"):
            return self.output.linear_terms_trained()
        return (bool(self.tok_embeddings.weight.requires_grad),)

    def head_terms_problem(self) -> str | None:
        """Why `head_terms` cannot stand in for `head` here (None when it can)."""
        if not self.last:
            return "not the last pipeline stage"
        if not hasattr(self, "output"):
            return None
        if getattr(self.output, "bias", None) is not None:
            return "the output projection has a bias"
        import mf_parallel as mp

        return mp.linear_terms_problem(self.output)


class PipelineStage(nn.Cell):
    """Every part of `model` that pipeline rank `pp_rank` holds under `layout` (see the module doc)."""

    def __init__(self, model, layout, pp_rank: int, sequence_shards: int = 1) -> None:
        super().__init__(auto_prefix=False)
        if layout.num_layers != model.args.num_hidden_layers:
            raise ModelConfigError(f"parallelism.pipeline_parallel_layers_per_stage: the layout places "
                                   f"{layout.num_layers} layers, model.num_hidden_layers is {model.args.num_hidden_layers}")
        if model.moe_layer_ids() and model.balance.kind == "switch":
            raise ModelConfigError("parallelism.pipeline_parallel: pipeline stages of a MoE model trained with "
                                   "transformers' switch balance loss (output_router_logits) are not implemented: "
                                   "the loss pools every layer's routing before one product, so it does not split "
                                   "into stages; set output_router_logits: false or pipeline_parallel: 1")
        infos = layout.chunks(pp_rank)
        first = any(i.first for i in infos)
        last = any(i.last for i in infos)
        parts: dict = {}
        self.tied = ()
        # Tied by the model, or by a parallel plan's output leaf sharing the table (untie_output).
        planned_tie = (not model.tie_word_embeddings and hasattr(model, "output")
                       and model.output.weight is model.tok_embeddings.weight)
        mtp_table = getattr(model, "mtp", None) is not None   # the last stage's MTP lookups share the table
        tied = model.tie_word_embeddings or planned_tie or mtp_table
        if first:
            self.tok_embeddings = parts["tok_embeddings"] = model.tok_embeddings
            if hasattr(model, "pos_embeddings"):          # learned positions (GPT-2), added by model.embed
                self.pos_embeddings = model.pos_embeddings
        if last:
            self.norm = parts["norm"] = model.norm
            if getattr(model, "mtp", None) is not None:        # multi-token prediction: on the last stage
                if model.tie_word_embeddings and not first:
                    raise ModelConfigError("parallelism.pipeline_parallel: multi-token prediction with tied embeddings "
                                           "on a last stage without the embedding is not implemented; set "
                                           "tie_word_embeddings: false (DeepSeek-V3's and GLM-4.5's) or "
                                           "num_nextn_predict_layers: 0")
                self.mtp = parts["mtp"] = model.mtp
                # the token table's leaf for the MTP lookups: the table itself, summed with the first
                # stage's like a tied head
                self.mtp_embeddings = parts["mtp_embeddings"] = model.mtp_embeddings
            if not model.tie_word_embeddings:
                self.output = parts["output"] = model.output
            elif not first:
                self.tok_embeddings = parts["tok_embeddings"] = _TiedTable(model.tok_embeddings.weight)
                self.tok_embeddings.weight.name = model.tok_embeddings.weight.name   # the table's global name
        if tied and len(layout.tied_ranks) > 1 and (first or last):
            if mtp_table and not first:
                self.tied = (self.mtp_embeddings.weight,)
            else:
                self.tied = (self.output.weight if planned_tie and not first else self.tok_embeddings.weight,)
        self.layers = _Layers(model.layers, [i for info in infos for i in info.layers])
        self.pp_rank = pp_rank
        # References, not sub-Cells: the parameters above already carry the global names.
        object.__setattr__(self, "chunks", [PipelineChunk(model, info, parts, sequence_shards) for info in infos])

    def train_routing(self, aux_weight: float) -> None:
        """Chunks holding routed MoE layers return their weighted balance loss and routing counts
        beside their output (see the module doc); `aux_weight` multiplies the model's own
        (already `aux_loss_alpha`-weighted) balance loss, as the one-process training loss does."""
        for chunk in self.chunks:
            chunk.side_outputs = bool(chunk.moe_rows)
            chunk.aux_weight = float(aux_weight)


def pipeline_stage(model, layout, pp_rank: int, sequence_shards: int = 1) -> PipelineStage:
    """The part of `model` (a CausalLM) that pipeline rank `pp_rank` runs under `layout`
    (an `mf_parallel.StageLayout`). Build the whole model with its seed first (and apply its
    parallel plan): every rank then starts from the same weights, and a rank keeps only its own
    parts. `sequence_shards`: the tensor-parallel degree when the plan shards the hidden states
    between blocks along the sequence (sequence parallelism), else 1."""
    return PipelineStage(model, layout, pp_rank, sequence_shards)
