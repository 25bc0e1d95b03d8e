"""`run_mode: finetune`: full fine-tuning, or LoRA with a `lora` section, from pretrained weights.

Start (no checkpoint of this run in `checkpoint.save_path` yet):
  * the weights of `checkpoint.load_path` (required): an HF directory, an mf checkpoint (the
    marker's iteration; weights only, whatever optimizer state it holds) or a merged directory
    (a LoRA adapter checkpoint too for full fine-tuning: merged into its base on load);
  * a fresh optimizer, step 0, consumed_samples 0, the LR schedule from its start;
  * with `lora`: adapters on the Linear modules `target_modules` matches (re.fullmatch over the
    module names, minus the layers of `exclude_layers`), every other weight frozen; only the
    adapters reach the optimizer, and checkpoints hold only the adapters (and their moments),
    marked as a LoRA adapter of `load_path` (mf-ckpt's `adapter` marking in common.json), so
    `mf ckpt merge-lora`, `mf generate`, `mf serve` and `mf eval` know their base.

Resume (a preempted fine-tune restarted with the same YAML): when `checkpoint.save_path` holds a
committed checkpoint of this same run (rundir.py: the same run identity, which holds the base
`load_path` as an absolute path and the `lora` settings), the run continues from it with its
full state (weights or adapters, optimizer moments and step, LR position, RNG, consumed_samples,
counters), exactly as `run_mode: train` resumes. A LoRA run reloads its frozen base from
`load_path` at the iteration recorded at the start. A committed checkpoint there of anything else
(pre-training, another base, other LoRA settings) is refused by the preflight: resuming it would
mix two runs, and saving beside it could rotate it away. `save_path` may not be `load_path`.

With `lora_dropout` > 0 the masks come from MindSpore's dropout kernels, whose random state lives
inside the compiled graph (no RNG snapshot reaches it) and, on CPU, whose concurrent kernels draw in
varying order: such runs are not bit-reproducible and a resumed run draws fresh masks (said in the
log). With `lora_dropout: 0` (the default) LoRA training is deterministic and resumes bit for bit.

`checkpoint.no_load_optim` has nothing to switch here: `load_path` is always read weights-only,
and resuming this run's own checkpoint always restores the optimizer (anything else would not
continue the run).
"""

from __future__ import annotations

import dataclasses
import logging
import os

import mf_ckpt
import mf_models
from mf_trainer.errors import TrainerConfigError

log = logging.getLogger("mf_trainer")



def _lora_settings(lora) -> dict | None:
    return None if lora is None else {k: v for k, v in dataclasses.asdict(lora).items()}


class Finetune:
    """The finetune plan of one run: base weights, LoRA adapters, resume from its own save_path."""

    def __init__(self, cfg, seed: int, run_directory=None):
        self.cfg = cfg
        self.seed = seed
        ckpt = cfg.checkpoint
        self.base = os.path.abspath(ckpt.load_path)
        self.lora = cfg.lora
        self.identity = {"base": self.base, "base_kind": None, "base_iteration": None, "lora": _lora_settings(self.lora)}
        self.base_adapter = None
        self.resume_path = self._own_checkpoint(run_directory)
        # The base is read unless a full fine-tune resumes (its own checkpoint holds every weight).
        if self.resume_path is None or self.lora is not None:
            try:
                info = mf_ckpt.load(self.base, {}, strict=False)
                self.base_adapter = mf_ckpt.read_adapter_meta(info.common, self.base)
            except mf_ckpt.CheckpointError as exc:
                raise TrainerConfigError(f"checkpoint.load_path: {exc}") from None
            if self.lora is not None and self.base_adapter is not None:
                raise TrainerConfigError(f"checkpoint.load_path: {ckpt.load_path} is a LoRA adapter checkpoint; new "
                                         "adapters need plain base weights: merge it first (mf ckpt merge-lora BASE "
                                         "ADAPTER OUT)")
            if self.resume_path is None:
                self.identity["base_kind"], self.identity["base_iteration"] = info.kind, info.iteration
        self.modules: list[str] = []
        self.excluded_layers: list[int] = []

    # ---- which checkpoint --------------------------------------------------------------------
    def _own_checkpoint(self, run_directory) -> str | None:
        """save_path when it holds a committed checkpoint of this run (rundir.py decided, and the
        preflight refused anything of another run there)."""
        if run_directory is None or not run_directory.resumes_own:
            return None
        mine = run_directory.common.get("finetune")
        if not isinstance(mine, dict):
            raise TrainerConfigError(f"checkpoint.save_path: {run_directory.save_path}: the checkpoint of this run "
                                     "records no fine-tune start (no 'finetune' in common.json)")
        # A LoRA resume reloads the frozen base exactly as the run started from it.
        self.identity["base_kind"], self.identity["base_iteration"] = mine.get("base_kind"), mine.get("base_iteration")
        return run_directory.save_path

    # ---- model -------------------------------------------------------------------------------
    def prepare_model(self, model) -> None:
        """Start weights from load_path, then LoRA adapters (before recompute marks sub-cells)."""
        if self.resume_path is None or self.lora is not None:
            self._load_base(model)
        if self.lora is None:
            return
        import mf_config

        lora = self.lora
        self.excluded_layers = list(mf_config.parse_layer_spec(lora.exclude_layers or [], model.args.num_hidden_layers,
                                                               "lora.exclude_layers"))
        try:
            self.modules = mf_models.apply_lora(model, lora.target_modules, lora.lora_rank, lora.lora_alpha,
                                                lora.lora_dropout, self.excluded_layers, seed=self.seed)
        except mf_models.ModelConfigError as exc:
            raise TrainerConfigError(str(exc)) from None
        model.set_train(True)  # LoRA dropout is active in training mode only
        if lora.lora_dropout > 0:
            log.warning("lora.lora_dropout %g: MindSpore's dropout keeps its random state inside its kernels, out of "
                        "reach of the RNG snapshot; on CPU, concurrent dropout kernels also draw in varying order. "
                        "This run is not bit-reproducible and a resume draws fresh masks (lora_dropout 0 is exact)",
                        lora.lora_dropout)
        trained = sum(p.size for p in model.trainable_params())
        total = sum(p.size for _, p in model.parameters_and_names())
        log.info("LoRA: rank %d, alpha %g, dropout %g on %d modules (%s); %d trainable parameters, %.2f%% of %d",
                 lora.lora_rank, lora.lora_alpha, lora.lora_dropout, len(self.modules),
                 ", ".join(mf_models.describe_lora_modules(self.modules)), trained, 100.0 * trained / total, total)

    def _load_base(self, model) -> None:
        from mf_trainer.checkpointing import load_options

        iteration = self.identity["base_iteration"] if self.identity["base_kind"] == "mf" else None
        try:
            loaded = mf_models.load_weights(model, self.base, iteration=iteration,
                                            options=load_options(self.cfg.checkpoint))
        except (mf_ckpt.CheckpointError, mf_models.ModelStateError) as exc:
            if getattr(model, "mtp_depth", 0) and "mtp." in str(exc):
                raise TrainerConfigError(
                    f"checkpoint.load_path: {self.base} holds no multi-token-prediction layer for model."
                    f"num_nextn_predict_layers={model.mtp_depth} (transformers saves none); set "
                    f"model.num_nextn_predict_layers: 0 to fine-tune without MTP") from None
            raise TrainerConfigError(f"checkpoint.load_path: {exc}") from None
        log.info("finetune: weights of %s (%s)", loaded.describe(), self.identity["base_kind"])

    # ---- what checkpoints hold, and where this run resumes from --------------------------------
    def held(self, model) -> set[str] | None:
        """The parameters a checkpoint of this run holds: the adapters (LoRA) or every weight (None)."""
        return set(mf_models.adapter_state(model)) if self.lora is not None else None

    def restore_source(self) -> tuple[str, bool] | None:
        """(this run's own save_path, resume) when it resumes itself; None: a fresh start."""
        return (self.resume_path, True) if self.resume_path else None

    def common(self) -> dict:
        """Added to common.json: the run's identity, and for LoRA mf-ckpt's adapter marking."""
        out = {"finetune": dict(self.identity)}
        if self.lora is not None:
            out["adapter"] = mf_ckpt.make_lora_adapter_meta(
                rank=self.lora.lora_rank, alpha=self.lora.lora_alpha, dropout=self.lora.lora_dropout,
                target_modules=self.lora.target_modules, modules=self.modules,
                exclude_layers=self.excluded_layers, base=self.base, base_kind=self.identity["base_kind"],
                base_iteration=self.identity["base_iteration"])
        return out
