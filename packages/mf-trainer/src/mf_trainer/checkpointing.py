"""Checkpoint glue: the `checkpoint` section -> mf-ckpt's SaveOptions / LoadOptions, and what a
training checkpoint holds.

Saved (mf-ckpt layout, `<save_path>/iteration_<step>/`):
  model      every model parameter under its mf name
  optimizer  `exp_avg.<name>`, `exp_avg_sq.<name>` (unless `no_save_optim`)
  common     step, consumed_samples, optimizer_step (AdamW's t), skipped/non-finite counters, the
             RNG states, the resolved LR schedule, `hf_config` (the model section, so
             `mf ckpt convert --to hf` works), the whole resolved YAML (`train_config`) and
             `hf_generation_config` (generation defaults in HF's generation_config.json terms)
  tokenizer  the tokenizer's files under `iteration_<step>/tokenizer/` (mf-ckpt assets,
             checksummed): `tokenizer.path`, or without one the tokenizer `load_path` carries. A
             copied checkpoint then generates, serves and converts to HF with no --tokenizer.

Loading (`load_path`), by what the directory holds:
  mf checkpoint with optimizer state  -> full resume: weights, moments, optimizer step, LR schedule
                                         position, RNG, consumed_samples, step counters
  `no_load_optim: true`                -> weights only; training starts at step 0
  mf checkpoint saved with no_save_optim, and no_load_optim false -> refused (it cannot resume
                                         exactly; say no_load_optim: true for a weights-only start)
  Hugging Face directory / merged safetensors -> weights only (a fine-tuning start)
  LoRA adapter checkpoint              -> refused in run_mode train (continue it with run_mode
                                         finetune, or merge it first); `run_mode: finetune` loads
                                         through finetune.py and resumes its own save_path here
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import mf_ckpt
from mf_trainer.errors import TrainerConfigError, TrainingError

log = logging.getLogger("mf_trainer")


def save_options(ckpt) -> mf_ckpt.SaveOptions:
    return mf_ckpt.SaveOptions(
        save_path=ckpt.save_path, enable_save=ckpt.enable_save, save_max=ckpt.save_max,
        save_interleaved_steps=ckpt.save_interleaved_steps, no_save_optim=ckpt.no_save_optim,
        async_save=ckpt.async_save, prefix=ckpt.prefix, remove_redundancy=ckpt.remove_redundancy,
        save_global_layout_cache=ckpt.save_global_layout_cache,
    )


def load_options(ckpt) -> mf_ckpt.LoadOptions:
    return mf_ckpt.LoadOptions(
        load_path=ckpt.load_path, load_balanced=ckpt.load_balanced, no_load_optim=ckpt.no_load_optim,
        load_worker_number=ckpt.load_worker_number,
    )


@dataclass
class Restored:
    """What a load brought back; `resume` False means weights only (start at step 0)."""

    resume: bool
    kind: str
    iteration: int | None
    common: dict
    source: str = ""  # the directory read (an mf checkpoint's iteration directory)


# The counters a resume reads from common.json: (field, required). Each must be an integer >= 0.
RESUME_COUNTERS = (("step", True), ("consumed_samples", True), ("optimizer_step", True),
                   ("skipped_steps", False), ("nonfinite_in_row", False))


def check_resume_common(common: dict, where: str) -> None:
    """The training state of common.json, checked before anything is restored from it: one line
    naming `where` (the file) and the field. The RNG state is checked where it is restored
    (runtime.set_rng_state), since checkpoint.load_rng_state: false skips it."""
    for name, required in RESUME_COUNTERS:
        if name not in common:
            if required:
                raise TrainerConfigError(f"{where}: {name}: missing (needed to resume)")
            continue
        value = common[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            raise TrainerConfigError(f"{where}: {name}: must be a non-negative integer, got {shown}")


def load_checkpoint(ckpt_cfg, model_state: dict, optimizer_state: dict, *, path: str | None = None,
                    resume: bool = False, comm=None) -> Restored:
    """Fill `model_state` (and `optimizer_state` on a resume) in place from `checkpoint.load_path`
    (or `path`). `resume=True` (a fine-tune continuing its own checkpoint) must restore the
    optimizer whatever `no_load_optim` says. In a parallel run the states hold this rank's
    `ShardedTensor` blocks and `comm` is mf-parallel's `Communicator` (every rank calls this)."""
    opts = load_options(ckpt_cfg)
    key = "checkpoint.load_path" if path is None else "checkpoint.save_path"
    if path is not None:
        opts = mf_ckpt.LoadOptions(load_path=path, load_balanced=opts.load_balanced, no_load_optim=False,
                                   load_worker_number=opts.load_worker_number)
    weights_only = mf_ckpt.LoadOptions(load_path=opts.load_path, load_balanced=opts.load_balanced,
                                       no_load_optim=True, load_worker_number=opts.load_worker_number)
    try:
        if not resume:  # an adapter checkpoint's tensors would only be reported as missing weights
            probe = mf_ckpt.load(weights_only, {}, None, strict=False, comm=comm)
            if mf_ckpt.read_adapter_meta(probe.common, opts.load_path) is not None:
                raise TrainerConfigError(
                    f"{key}: {opts.load_path} is a LoRA adapter checkpoint: continue it with run_mode finetune and "
                    "its lora section (the fine-tune resumes from its own save_path), or merge it into its base "
                    "(mf ckpt merge-lora BASE ADAPTER OUT) for a weights-only start")
        result = mf_ckpt.load(weights_only, model_state, None, strict=True, comm=comm)
    except mf_ckpt.CheckpointError as exc:
        raise TrainerConfigError(f"{key}: {exc}") from None
    common = dict(result.common)
    if result.kind != "mf" and not resume:
        log.info("loaded model weights from %s (%s directory): weights-only start at step 0", opts.load_path,
                 result.kind)
        return Restored(False, result.kind, None, common)
    if opts.no_load_optim and not resume:
        log.info("loaded model weights of iteration %s from %s (no_load_optim: starting at step 0)",
                 result.iteration, opts.load_path)
        return Restored(False, result.kind, result.iteration, common)
    if "step" not in common:
        raise TrainerConfigError(f"{key}: {opts.load_path} was not written by mf-trainer (no step in "
                                 "common.json); set checkpoint.no_load_optim: true for a weights-only start")
    try:
        # The same iteration as the weights, even if another one were committed meanwhile.
        opt_result = mf_ckpt.load(opts, {}, optimizer_state, iteration=result.iteration, strict=True, comm=comm)
    except mf_ckpt.CheckpointError as exc:
        if resume:
            raise TrainerConfigError(f"{key}: cannot restore the optimizer state of this run's checkpoint ({exc}); "
                                     "one saved with no_save_optim cannot be resumed: remove it to start over") from None
        raise TrainerConfigError(
            f"{key}: cannot restore the optimizer state ({exc}); a checkpoint saved with "
            "no_save_optim cannot resume exactly: set checkpoint.no_load_optim: true for a weights-only start") from None
    if not opt_result.optimizer_loaded:
        raise TrainerConfigError(f"{key}: {opts.load_path} holds no optimizer state")
    check_resume_common(common, f"{key}: {result.source}/common.json")  # before anything is restored from it
    log.info("resuming from %s at step %d (consumed_samples %d)", opts.load_path, common["step"],
             common.get("consumed_samples", 0))
    return Restored(True, result.kind, result.iteration, common, result.source)


@dataclass
class Carried:
    """What every checkpoint of a run carries so it stands on its own (`carried(cfg)`)."""

    assets: dict = field(default_factory=dict)     # mf-ckpt assets: {"tokenizer/<file>": bytes}
    common: dict = field(default_factory=dict)     # added to common.json: hf_generation_config
    tokenizer: str | None = None                   # where the tokenizer came from


def _tokenizer_source(cfg) -> str | None:
    """tokenizer.path, or (fine-tuning or resuming without one) the tokenizer load_path carries."""
    path = cfg.tokenizer.path
    if path:
        if os.path.exists(path):
            return path
        log.warning("tokenizer.path %s not found: checkpoints will carry no tokenizer", path)
        return None
    if cfg.checkpoint.load_path and os.path.isdir(cfg.checkpoint.load_path):
        try:
            found = mf_ckpt.find_tokenizer(cfg.checkpoint.load_path)
        except mf_ckpt.CheckpointError as exc:
            raise TrainerConfigError(f"checkpoint.load_path: {exc}") from None
        return found.path if found is not None else None
    return None


def _base_generation_config(cfg) -> dict:
    if not (cfg.checkpoint.load_path and os.path.isdir(cfg.checkpoint.load_path)):
        return {}
    try:
        common = mf_ckpt.load(cfg.checkpoint.load_path, {}, strict=False).common
    except mf_ckpt.CheckpointError:
        return {}   # the restore reports what is wrong with it, with its field
    generation = common.get("hf_generation_config")
    return dict(generation) if isinstance(generation, dict) else {}


def generation_config(cfg, tokenizer=None, base: dict | None = None) -> dict:
    """generation_config.json (HF's names) of the run's checkpoints: the base model's, if it has one
    (a fine-tune keeps its base's recommended sampling), then the `inference` settings the YAML sets
    away from their defaults, and the stop ids: the model's eos_token_id (else the tokenizer's EOS)
    plus inference.stop_token_ids, the ids `mf generate` and `mf serve` stop at."""
    import mf_config

    out = dict(base or {})
    inf, defaults = cfg.inference, mf_config.InferenceConfig()
    out.setdefault("do_sample", inf.do_sample)
    out.setdefault("max_new_tokens", inf.max_new_tokens)
    for name in ("do_sample", "max_new_tokens", "temperature", "top_k", "top_p"):
        if getattr(inf, name) != getattr(defaults, name):
            out[name] = getattr(inf, name)
    model = cfg.model.extra
    eos = out.get("eos_token_id", model.get("eos_token_id"))
    if eos is None and tokenizer is not None:
        eos = tokenizer.eod
    ids = [] if eos is None else list(eos) if isinstance(eos, list) else [eos]
    ids += [t for t in inf.stop_token_ids or () if t not in ids]
    if ids:
        out["eos_token_id"] = ids[0] if len(ids) == 1 else ids
    for name, value in (("bos_token_id", model.get("bos_token_id", tokenizer.bos if tokenizer is not None else None)),
                        ("pad_token_id", model.get("pad_token_id"))):
        if value is not None:
            out.setdefault(name, value)
    return out


def carried(cfg) -> Carried:
    """The tokenizer's files and the generation defaults every checkpoint of `cfg`'s run carries."""
    import mf_data

    source = _tokenizer_source(cfg)
    tokenizer, assets = None, {}
    if source is not None:
        try:
            tokenizer = mf_data.load_tokenizer(source)
            assets = mf_ckpt.tokenizer_assets(mf_data.tokenizer_files(source))
        except (mf_data.MFDataError, mf_ckpt.CheckpointError) as exc:
            key = "tokenizer.path" if cfg.tokenizer.path else "checkpoint.load_path"
            raise TrainerConfigError(f"{key}: {exc}") from None
    generation = generation_config(cfg, tokenizer, _base_generation_config(cfg))
    return Carried(assets, {"hf_generation_config": generation}, source)


class CheckpointSaver:
    """Owns the mf-ckpt Saver: saves on schedule and at the end, fires `on_save` once committed.
    `comm`: mf-parallel's `Communicator` in a parallel run (each rank writes its own blocks).
    `carry`: what every checkpoint carries besides the training state (`carried(cfg)`)."""

    def __init__(self, ckpt_cfg, comm=None, carry: Carried | None = None):
        self.options = save_options(ckpt_cfg)
        self.saver = mf_ckpt.Saver(self.options, comm) if self.options.enable_save else None
        self._pending = None  # (step, SaveResult) of an async save not yet committed
        self.last_saved_step: int | None = None
        self.carry = carry or Carried()
        if self.saver is not None and carry is not None:
            log.info("checkpoints carry %s and the generation defaults %s",
                     f"the tokenizer {carry.tokenizer}" if carry.assets else "no tokenizer",
                     carry.common.get("hf_generation_config"))

    @property
    def pending(self) -> bool:
        """An async save has been started and not committed yet."""
        return self._pending is not None

    def should_save(self, step: int) -> bool:
        return self.options.should_save(step)

    def save(self, step: int, model_state: dict, optimizer_state: dict | None, common: dict) -> list[tuple[int, str]]:
        """Save `step`; returns the (step, path) of every save committed by this call."""
        if self.saver is None:
            return []
        committed = self.poll(block=True)
        try:
            result = self.saver.save(step, model_state, optimizer_state, common={**common, **self.carry.common},
                                     assets=self.carry.assets)
        except mf_ckpt.CheckpointError as exc:
            raise TrainingError(f"saving checkpoint {step} failed: {exc}") from None
        self.last_saved_step = step
        if self.options.async_save:
            self._pending = (step, result)
        else:
            committed.append((step, str(result.path)))
        return committed

    def poll(self, block: bool = False) -> list[tuple[int, str]]:
        """Commit a finished async save; with `block`, wait for it."""
        if self.saver is None or self._pending is None:
            return []
        try:
            done = self.saver.wait() is not None if block else self.saver.poll()
        except mf_ckpt.CheckpointError as exc:
            raise TrainingError(f"saving checkpoint {self._pending[0]} failed: {exc}") from None
        if not done:
            return []
        step, result = self._pending
        self._pending = None
        return [(step, str(result.path))]

    def finalize(self) -> list[tuple[int, str]]:
        committed = self.poll(block=True)
        if self.saver is not None:
            self.saver.finalize()
        return committed
