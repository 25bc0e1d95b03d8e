"""MoE training fields: `monitor.moe_monitor` acts on a model's routed MoE layers only.

Like MindFormers' own MoE monitor, `target_layers` are decoder layer ids: a target without experts
(DeepSeek-V3's first dense layers, the reference skeleton's `[0, 1, 2]`) is a notice and the rest
are monitored; a model without routed experts, or targets without an interval, record nothing and
are a notice too (telemetry with nothing to act on).

(Expert parallelism and its dispatcher knobs: preflight/expert.py.)
"""

from __future__ import annotations

from mf_trainer.preflight.registry import TRAINING, Notice, check


@check(commands=TRAINING)
def moe_monitor(t):
    """moe_monitor records tokens per expert of MoE layers at a positive interval."""
    mon = t.cfg.monitor.moe_monitor
    interval, targets = mon.save_tokens_per_expert_interval, mon.target_layers
    if interval is None and targets is None:
        return
    key = "monitor.moe_monitor"     # (mf-config checks the interval is positive, the layers unique)
    if interval is None:
        yield Notice(key + ".target_layers", "set while save_tokens_per_expert_interval is null: nothing is recorded")
    args = t.model_args
    if args is None:
        return      # the model section's own check says why
    layers = args.moe_layer_ids()
    if not layers:
        yield Notice(key, f"model {t.cfg.model.model_type!r} has no routed MoE layers: there are no tokens per expert "
                          "to record")
        return
    for layer in targets or []:
        if layer not in layers:
            yield Notice(key + ".target_layers", f"layer {layer} has no routed experts (the MoE layers are "
                                                 f"{_ranges(layers)}): not monitored")


def _ranges(ids: list[int]) -> str:
    """[1, 2, 3, 5] -> '1-3, 5'."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
