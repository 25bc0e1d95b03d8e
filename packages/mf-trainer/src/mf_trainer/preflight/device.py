"""The `context` section against the device (CPU or Ascend)."""

from __future__ import annotations

from mf_trainer.preflight.registry import COMMANDS, Notice, check


@check(commands=COMMANDS, needs=("device",))
def device_id(t):
    """context.device_id picks an accelerator; a CPU run has one device."""
    if t.device == "CPU" and t.cfg.context.device_id != 0:
        yield Notice("context.device_id", f"{t.cfg.context.device_id}: a CPU run has no device index to pick")
