"""Every scheduler against values computed by hand from its formula (see the README)."""

from __future__ import annotations

import pytest

from mf_trainer.errors import TrainerConfigError
from mf_trainer.lr_schedulers import SCHEDULERS, build_scheduler


def lrs(type_name, steps, total=10, lr=1.0, **extra):
    sched = build_scheduler(type_name, lr, extra, total_steps=total)
    return [round(sched(s), 10) for s in steps]


def test_constant_warmup():
    assert lrs("ConstantWarmUpLR", [0, 1, 2, 3, 4, 9, 50], warmup_steps=4, warmup_lr_init=0.2) == \
        [0.2, 0.4, 0.6, 0.8, 1.0, 1.0, 1.0]
    # warmup_ratio 0.25 of 8 steps = 2 warm-up steps
    assert lrs("ConstantWarmUpLR", [0, 1, 2], total=8, warmup_ratio=0.25) == [0.0, 0.5, 1.0]
    # type null = constant
    assert lrs(None, [0, 5], lr=0.3) == [0.3, 0.3]


def test_linear_with_warmup():
    # W=2, T=10: after warm-up lr * (10 - s) / 8
    assert lrs("LinearWithWarmUpLR", [0, 1, 2, 6, 10, 12], warmup_steps=2) == [0.0, 0.5, 1.0, 0.5, 0.0, 0.0]
    assert lrs("LinearWithWarmUpLR", [6, 10], warmup_steps=2, lr_end=0.2) == [0.6, 0.2]


def test_cosine_with_warmup():
    # W=2, T=10, lr_end=0.1: progress (s-2)/8; s=6 -> cos(pi/2)=0 -> 0.1 + 0.9 * 0.5
    assert lrs("CosineWithWarmUpLR", [1, 2, 6, 10, 11], warmup_steps=2, lr_end=0.1) == [0.5, 1.0, 0.55, 0.1, 0.1]
    # decay_steps=6 (absolute): the cosine ends at s=6; s=4 is half way -> 0.5
    assert lrs("CosineWithWarmUpLR", [4, 6, 8], warmup_steps=2, decay_steps=6) == [0.5, 0.0, 0.0]
    # decay_ratio 0.5 of 12 steps = 6 (same schedule); min_lr is lr_end's alias
    assert lrs("CosineWithWarmUpLR", [4, 6], total=12, warmup_steps=2, decay_ratio=0.5, min_lr=0.0) == [0.5, 0.0]
    # num_cycles 1: a full cosine over (s-W)/(T-W): at progress 0.25 -> 0.5*(1+cos(pi/2)) = 0.5
    assert lrs("CosineWithWarmUpLR", [0, 2, 4], warmup_steps=0, total=8, num_cycles=1.0) == [1.0, 0.5, 0.0]


def test_cosine_with_restarts():
    # W=0, T=8, num_cycles=2: phase = (2 * s / 8) % 1; s=2 -> 0.5 -> 0.5; s=4 -> restart -> 1.0; s=6 -> 0.5
    assert lrs("CosineWithRestartsAndWarmUpLR", [0, 2, 4, 6, 8], total=8, warmup_steps=0, num_cycles=2.0) == \
        [1.0, 0.5, 1.0, 0.5, 0.0]
    assert lrs("CosineWithRestartsAndWarmUpLR", [8], total=8, warmup_steps=0, lr_end=0.05) == [0.05]


def test_polynomial_with_warmup():
    # W=2, T=10 -> decay_steps 8; power 2, lr_end 0.1: s=6 -> 0.1 + 0.9 * 0.5^2 = 0.325
    assert lrs("PolynomialWithWarmUpLR", [1, 2, 6, 10], warmup_steps=2, power=2.0, lr_end=0.1) == \
        [0.5, 1.0, 0.325, 0.1]
    # decay_steps 4 after warm-up: s=4 -> 0.1 + 0.9 * (1 - 2/4) = 0.55, ends at s=6
    assert lrs("PolynomialWithWarmUpLR", [4, 6, 9], warmup_steps=2, decay_steps=4, lr_end=0.1) == [0.55, 0.1, 0.1]


def test_warmup_stable_decay():
    # W=2, stable until 6, linear to lr_end 0.2 at T=10
    assert lrs("WarmUpStableDecayLR", [1, 2, 5, 6, 8, 10], warmup_steps=2, decay_start_steps=6, lr_end=0.2) == \
        [0.5, 1.0, 1.0, 1.0, 0.6, 0.2]
    assert lrs("WarmUpStableDecayLR", [8], warmup_steps=2, decay_start_ratio=0.6, lr_end=0.2) == [0.6]


def test_constant_with_cooldown():
    # W=2, keep 2, cosine over 4 from 1.0 to lr_end1 0.2, hold 0.2 for 2, then lr_end2 0.1
    got = lrs("ConstantWithCoolDownLR", [1, 3, 4, 6, 8, 9, 10, 20], total=20, warmup_steps=2, keep_steps=2,
              decay_steps=4, lr_end1=0.2, final_steps=2, lr_end2=0.1)
    assert got == [0.5, 1.0, 1.0, 0.6, 0.2, 0.2, 0.1, 0.1]
    # decay_steps defaults to what is left: 12 - 2 - 2 - 2 = 6; s=7 is half way
    assert lrs("ConstantWithCoolDownLR", [7], total=12, warmup_steps=2, keep_steps=2, final_steps=2) == [0.5]
    assert lrs("ConstantWithCoolDownLR", [12], total=12, warmup_steps=2, decay_steps=4,
               lr_end1=0.3) == [0.3]


def test_unknown_key_names_the_scheduler_and_its_accepted_keys():
    with pytest.raises(TrainerConfigError) as err:
        build_scheduler("CosineWithWarmUpLR", 1.0, {"warmup_step": 3}, total_steps=10)
    msg = str(err.value)
    assert msg.startswith("lr_scheduler.warmup_step: CosineWithWarmUpLR takes no such key; accepted keys:")
    for key in ("decay_ratio", "decay_steps", "lr_end", "num_cycles", "warmup_steps", "warmup_ratio", "min_lr"):
        assert key in msg


def test_unknown_type_lists_the_available_ones():
    with pytest.raises(TrainerConfigError, match="unknown scheduler 'Cosine'; available: " + ", ".join(sorted(SCHEDULERS))):
        build_scheduler("Cosine", 1.0, {}, total_steps=10)
    assert len(SCHEDULERS) == 7


@pytest.mark.parametrize("extra, match", [
    ({"warmup_steps": 2, "warmup_ratio": 0.1}, "give warmup_steps or warmup_ratio, not both"),
    ({"warmup_ratio": 1.5}, r"warmup_ratio: must be a number in \[0, 1\]"),
    ({"warmup_steps": 2.5}, "warmup_steps: must be an integer >= 0"),
    ({"lr_end": 1.0}, "lr_end: must be below learning_rate"),
    ({"lr_end": 0.1, "min_lr": 0.1}, "give lr_end or its alias min_lr, not both"),
])
def test_bad_values(extra, match):
    with pytest.raises(TrainerConfigError, match=match):
        build_scheduler("PolynomialWithWarmUpLR", 1.0, extra, total_steps=10)


def test_total_steps_defaults_to_training_steps_and_can_be_overridden():
    assert build_scheduler("LinearWithWarmUpLR", 1.0, {}, total_steps=10)(5) == 0.5
    assert build_scheduler("LinearWithWarmUpLR", 1.0, {"total_steps": 20}, total_steps=10)(5) == 0.75
