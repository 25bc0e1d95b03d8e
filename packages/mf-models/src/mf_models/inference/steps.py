"""The two Cells the engine calls: prefill one prompt into a slot, and decode one token for every slot.

Both end with the token chooser, so a call returns token ids (int32) and nothing else crosses from
device to host. Shapes are static per Cell: a prefill Cell is built per prompt-length bucket and a
decode Cell per (rows, attention-length) bucket, each for greedy-only or sampling rows, and
created on first use (in GRAPH_MODE: one compile each, reused for the life of the engine).

Their `phase` is MindSpore's inference phase ("prefill" / "increment"): once compiled, calling
the Cell runs its graph without `Cell.__call__`'s per-call compile check, which walks every
sub-cell of the model (0.4-0.6 ms of Python per call for the 20M llama, measured as CPU time of
the calling thread; a decode step is a few ms). Shapes are static per Cell, so the check has
nothing to find.
"""

from __future__ import annotations

from mindspore import nn, ops

from ..common.transformer import CausalLM
from .cache import DecodeView, PrefillView
from .sampling import TokenChooser


class PrefillStep(nn.Cell):
    """ids [R, Pb] (right-padded) -> the first generated tokens [R], each chosen from the logits at
    `last` [R] (the prompt's last real position); row r's keys fill slot `slot[r]`."""

    def __init__(self, model: CausalLM, view: PrefillView, chooser: TokenChooser):
        super().__init__(auto_prefix=False)  # the model's parameter names stay unprefixed
        self.model, self.view, self.chooser = model, view, chooser
        self.phase = "prefill"

    def construct(self, ids, slot, last, temperature, top_k, top_p, uniform, greedy):
        self.view.set_inputs(slot)
        h = self.model.hidden_states(ids, self.view.positions, None, self.view)     # [R, Pb, H]
        at = ops.broadcast_to(last.reshape(-1, 1, 1), (h.shape[0], 1, h.shape[2]))
        logits = self.model.head(ops.gather_d(h, 1, at)[:, 0])                        # [R, V]
        return self.chooser(logits, temperature, top_k, top_p, uniform, greedy)


class DecodeStep(nn.Cell):
    """tokens [slots] at positions [slots] (each slot its own) -> next tokens [slots]."""

    def __init__(self, model: CausalLM, view: DecodeView, chooser: TokenChooser):
        super().__init__(auto_prefix=False)
        self.model, self.view, self.chooser = model, view, chooser
        self.phase = "increment"

    def construct(self, tokens, positions, temperature, top_k, top_p, uniform, greedy):
        self.view.set_inputs(positions)
        h = self.model.hidden_states(tokens.reshape(-1, 1), positions.reshape(-1, 1), None, self.view)
        logits = self.model.head(h[:, 0])                                             # [slots, V]
        return self.chooser(logits, temperature, top_k, top_p, uniform, greedy)
