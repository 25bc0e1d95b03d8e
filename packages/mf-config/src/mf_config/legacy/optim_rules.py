"""`optimizer` and `lr_schedule` -> `optimizer` and `lr_scheduler`.

mf has one optimizer, AdamW with PyTorch semantics (bias correction). MindFormers' `AdamW` is the
same; its `AdamWeightDecay` family has no bias correction (the first steps differ). MindFormers'
defaults (betas (0.9, 0.999), weight decay 0) differ from mf's ([0.9, 0.95], 0.01), so a value
the old file left out is written explicitly. The schedulers keep MindFormers' names and keys.
"""

from __future__ import annotations

from mf_config.errors import fmt_value
from mf_config.legacy.model_tables import OPTIMIZER_DROPS, OPTIMIZERS, SCHEDULER_KEYS
from mf_config.legacy.session import Migration
from mf_config.legacy.tables import gone, lookup

OPT = ("optimizer",)
LR = ("lr_schedule",)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def migrate_optimizer(m: Migration) -> None:
    opt = m.src.mapping(OPT)
    if not opt:
        return
    name = opt.get("type", "AdamW")
    spec = lookup(OPTIMIZERS, name)
    m.set("optimizer.type", "AdamW")
    if spec is None:
        m.dropped((*OPT, "type"), f"mf has AdamW only: AdamW is written with MindFormers' AdamW defaults for what "
                                  f"the old file left out ({name} does not exist in mf)")
        spec = OPTIMIZERS["AdamW"]
    elif name != "AdamW":
        m.translated((*OPT, "type"), "optimizer.type: AdamW" + ("" if spec.bias_correction else
                                     f"; {name} had no bias correction, mf's AdamW has it: the first steps differ"))
    elif "type" in opt:
        m.src.mark((*OPT, "type"))
    _betas(m, opt, spec)
    written = []
    for key, default in (("eps", spec.eps), ("weight_decay", spec.weight_decay)):
        if key in opt:
            m.copy((*OPT, key), f"optimizer.{key}")
        else:
            m.set(f"optimizer.{key}", default)
            written.append(f"{key} {fmt_value(default)}")
    if written:
        m.line(OPT, "translated", f"MindFormers' {name} defaults written explicitly (mf's differ): "
               f"{', '.join(written)}", mark=False)
    if "learning_rate" in opt:
        if m.src.mapping(LR):
            m.unneeded((*OPT, "learning_rate"), "lr_schedule.learning_rate is the one MindFormers used")
        else:
            m.copy((*OPT, "learning_rate"), "lr_scheduler.learning_rate")
    m.drop_table(OPT, OPTIMIZER_DROPS, gone("mf's AdamW takes no such key"))


def _betas(m: Migration, opt: dict, spec) -> None:
    if "betas" in opt:
        m.copy((*OPT, "betas"), "optimizer.betas", [float(b) if _number(b) else b for b in opt["betas"]]
               if isinstance(opt["betas"], (list, tuple)) else opt["betas"])
        for key in ("beta1", "beta2"):
            if key in opt:
                m.unneeded((*OPT, key), "betas is given and is the one kept")
        return
    # a malformed beta is written as it is: validation then names it (optimizer.betas[0]: ...)
    betas = [float(b) if _number(b) else b for b in (opt.get("beta1", spec.betas[0]), opt.get("beta2", spec.betas[1]))]
    m.set("optimizer.betas", betas)
    given = [k for k in ("beta1", "beta2") if k in opt]
    for key in given:
        m.translated((*OPT, key), f"optimizer.betas: {betas}")
    if len(given) < 2:
        m.line(OPT, "translated", f"optimizer.betas: {betas} (MindFormers' default for what was left out; mf's "
               "default is [0.9, 0.95])", mark=False)


def migrate_lr_schedule(m: Migration) -> None:
    lr = m.src.mapping(LR)
    if not lr:
        return
    m.line(LR, "translated", "lr_scheduler (the same scheduler names and keys)", mark=False)
    name = lr.get("type")
    accepted = lookup(SCHEDULER_KEYS, name)
    if accepted is None:
        m.dropped((*LR, "type"), f"mf's trainer has no {fmt_value(name)} scheduler (it has "
                                 f"{', '.join(SCHEDULER_KEYS)}): a constant learning rate is used")
    else:
        m.set("lr_scheduler.type", name)
        m.src.mark((*LR, "type"))
    if "learning_rate" in lr:
        m.set("lr_scheduler.learning_rate", lr["learning_rate"])
        m.src.mark((*LR, "learning_rate"))
    total = lr.get("total_steps")
    if "total_steps" in lr:
        if total is None or (_number(total) and total <= 0):
            m.unneeded((*LR, "total_steps"), f"{fmt_value(total)} meant 'every step of the run': mf fills in "
                                             "training.steps")
        elif accepted is not None:
            m.set("lr_scheduler.total_steps", total)
            m.src.mark((*LR, "total_steps"))
    if lr.get("warmup_ratio") is not None and "warmup_steps" in lr:
        m.unneeded((*LR, "warmup_steps"), "warmup_ratio is given and overrides it (as in MindFormers)")
    for key, value in lr.items():
        path = (*LR, key)
        if m.src.is_handled(path):
            continue
        if accepted is None:
            m.dropped(path, "a setting of the scheduler that is not carried")
        elif key in accepted:
            m.set(f"lr_scheduler.{key}", value)
            m.src.mark(path)
        else:
            m.dropped(path, f"mf's {name} takes no such key (it takes {', '.join(sorted(accepted))})")
