"""What a YAML may leave to the files it names: a fine-tune's model section (its base's config)
and the weights `mf eval` / `mf generate` use for a training YAML (the run's own checkpoint).

    cfg, note = complete_model_section(cfg)         # run_mode finetune without `model`
    cfg, note = weights_for_inference(cfg, explicit=None)

**Model section.** A `run_mode: finetune` YAML may omit `model`: it is then the model recorded with
`checkpoint.load_path` (an HF directory's config.json, or the `hf_config` of an mf checkpoint),
with the YAML's own `model` keys, if any, on top (e.g. `model: {compute_dtype: bfloat16}`). A
load_path that records none leaves the section incomplete, and the preflight says so.

**Weights of a training YAML.** A `run_mode: train | finetune` YAML given to `mf eval` or `mf
generate` means "the weights this run produced": the last committed checkpoint in
`checkpoint.save_path` (a fine-tune's adapters merge into their base on load); `checkpoint.load_path`
(the weights the run started from) only while save_path holds no checkpoint yet. Weights given on
the command line (`--weights PATH`, or `--set checkpoint.load_path=...`) win. An eval / predict
YAML keeps its checkpoint.load_path. The note says which weights were chosen and why.

Reads files (mf-ckpt, no tensor), never writes; no MindSpore.
"""

from __future__ import annotations

import copy
import os


def _recorded_model(load_path: str) -> dict | None:
    import mf_ckpt

    try:
        common = mf_ckpt.load(load_path, {}, strict=False).common
    except (mf_ckpt.CheckpointError, OSError, ValueError):
        return None     # the preflight / the load name the problem
    hf = common.get("hf_config") if isinstance(common, dict) else None
    return hf if isinstance(hf, dict) else None


def complete_model_section(cfg):
    """(cfg with its model section filled from checkpoint.load_path, the note to log) for a
    fine-tune YAML without model_type / architectures; (cfg, None) otherwise."""
    import mf_config

    model = cfg.model
    if cfg.run_mode != "finetune" or model.model_type or model.architectures or not cfg.checkpoint.load_path:
        return cfg, None
    if not os.path.exists(cfg.checkpoint.load_path):
        return cfg, None
    recorded = _recorded_model(cfg.checkpoint.load_path)
    if recorded is None:
        return cfg, None
    section = {k: v for k, v in recorded.items() if v is not None}
    arch = section.get("architectures")
    if isinstance(arch, list):
        section["architectures"] = arch[0] if arch else None
    section.update(copy.deepcopy(model.extra))
    raw = mf_config.config_to_dict(cfg)
    raw["model"] = {k: v for k, v in section.items() if v is not None}
    try:
        completed = mf_config.load_config(raw)
    except mf_config.ConfigError:
        return cfg, None     # the preflight reports the incomplete section
    where = os.path.join(cfg.checkpoint.load_path, "config.json") if os.path.isfile(
        os.path.join(cfg.checkpoint.load_path, "config.json")) else f"{cfg.checkpoint.load_path} (hf_config)"
    extra = completed.model.extra
    shape = ", ".join(f"{k} {extra[k]}" for k in ("num_hidden_layers", "hidden_size", "vocab_size") if k in extra)
    own = f"; the YAML's model keys {', '.join(sorted(model.extra))} on top" if model.extra else ""
    note = f"model: taken from {where} ({completed.model.model_type}: {shape}){own}, as the YAML omits it"
    return completed, note


def _committed(save_path: str) -> int | None:
    import mf_ckpt

    if not save_path or not os.path.isfile(os.path.join(save_path, "latest_checkpointed_iteration.txt")):
        return None
    try:
        return mf_ckpt.load(save_path, {}, strict=False).iteration
    except (mf_ckpt.CheckpointError, OSError, ValueError):
        return None


def weights_for_inference(cfg, explicit: str | None = None):
    """(cfg whose checkpoint.load_path is the weights to evaluate / generate with, the note)."""
    ckpt = cfg.checkpoint
    if explicit:
        chosen, why = explicit, "given on the command line"
    elif cfg.run_mode not in ("train", "finetune"):
        return cfg, f"weights: {ckpt.load_path} (checkpoint.load_path)" if ckpt.load_path else None
    else:
        iteration = _committed(ckpt.save_path)
        what = "fine-tuned" if cfg.run_mode == "finetune" else "trained"
        if iteration is not None:
            chosen, why = ckpt.save_path, f"the run's {what} weights: checkpoint.save_path, iteration {iteration}"
        elif ckpt.load_path:
            chosen, why = ckpt.load_path, (f"checkpoint.load_path, the weights the run starts from: "
                                           f"checkpoint.save_path {ckpt.save_path} holds no checkpoint yet")
        else:
            return cfg, None    # the preflight: evaluation needs weights
    if chosen == ckpt.load_path:
        return cfg, f"weights: {chosen} ({why})"
    import mf_config

    raw = mf_config.config_to_dict(cfg)
    raw["checkpoint"]["load_path"] = chosen
    return mf_config.load_config(raw), f"weights: {chosen} ({why})"
