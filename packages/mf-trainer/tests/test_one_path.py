"""One training path: the Trainer on one process is the one-rank layout (the model's plan,
GlobalNormClip, the sharded checkpoint state, all applied), and it trains bit for bit like the
plain one-process step it replaced: a model with no plan, mf-trainer's own sum-of-squares norm, the
same batches and learning rates."""

from __future__ import annotations

import mf_config
import mf_models
from mf_trainer import Callback, Trainer
from mf_trainer.loss import MaskedLMLoss
from mf_trainer.lr_schedulers import build_scheduler
from mf_trainer.optimizer import build_adamw
from mf_trainer.step import StepRunner


class Batches(Callback):
    """Each step's grad norm, as the Trainer logged it."""

    def __init__(self):
        self.norms = []

    def on_step_end(self, trainer, metrics):
        self.norms.append(metrics["grad_norm"])


def test_one_process_is_the_one_rank_layout_bit_for_bit(tmp_path, tiny_corpus, tiny_config):
    raw = tiny_config(tmp_path, tiny_corpus, context={"mode": 1}, training={"steps": 4, "max_norm": 0.05},
                      checkpoint={"enable_save": False}, monitor={"train_state": {"device_norm": True},
                                                                 "tensorboard": False})
    cfg = mf_config.load_config(raw)
    seen = Batches()
    trainer = Trainer(cfg, callbacks=[seen])
    assert trainer.parallel.world == 1 and trainer.parallel.dims.describe().endswith("(single rank)")
    # one resolved layout, the preflight's, handed unchanged to the context and the model's plan
    assert trainer.parallel.layout is trainer.layout and trainer.parallel.options(None).layout is trainer.layout
    assert set(trainer.sharded.model_state()) == set(mf_models.model_state(trainer.model))   # whole tensors
    result = trainer.train()

    # The plain one-process step: no plan, the default GradNorm (sum of squares in parameter order).
    model = mf_models.build_model({k: v for k, v in {"model_type": cfg.model.model_type, **cfg.model.extra}.items()
                                   if v is not None}, seed=cfg.training.seed)
    opt = build_adamw([(p.name, p) for p in model.trainable_params()], cfg.optimizer)
    runner = StepRunner(MaskedLMLoss(model), opt, cfg.training.max_norm, trainer.accumulation)
    schedule = build_scheduler(cfg.lr_scheduler.type, cfg.lr_scheduler.learning_rate, cfg.lr_scheduler.extra,
                               total_steps=cfg.training.steps)
    trainer.loader.load_state_dict({"consumed_samples": 0})
    batches = iter(trainer.loader)
    losses, norms = [], []
    try:
        for _ in range(cfg.training.steps):
            done = runner([next(batches) for _ in range(trainer.accumulation)], schedule(opt.step))
            losses.append(done.loss)
            norms.append(done.grad_norm)
    finally:
        batches.close()
    assert sum(n > cfg.training.max_norm for n in norms) > 0          # clipping takes part
    assert result.losses == losses and seen.norms == norms            # exactly, not approximately
    got, want = mf_models.model_state(trainer.model), mf_models.model_state(model)
    assert all((got[k] == want[k]).all() for k in want)
