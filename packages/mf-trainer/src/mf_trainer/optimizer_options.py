"""The `optimizer` section checked without MindSpore: which optimizer, and its pass-through keys.

`OptimizerConfig` is an `allow_extra` section: `type`, `betas`, `eps`, `weight_decay`,
`weight_decay_include` / `weight_decay_exclude` are its fixed fields, everything else is passed
to the optimizer named by `type`. AdamW takes no other key. Muon takes the keys of `MUON_KEYS`
(MindFormers' names where it has one, PyTorch's `torch.optim.Muon` names otherwise); its AdamW
part (embeddings, head, norms, biases, `adamw_params`) uses the section's fixed `betas` and `eps`.

The preflight calls `optimizer_options(cfg)` so `mf config validate` refuses what the Trainer
would refuse, in the same words. Which parameters a pattern matches is only known with the model
(`muon_mask`, called by the optimizer builder).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from mf_trainer.errors import TrainerConfigError

OPTIMIZERS = ("AdamW", "Muon")
ADAMW_KEYS = ("type", "betas", "eps", "weight_decay", "weight_decay_include", "weight_decay_exclude")

# Keller Jordan's quintic Newton-Schulz coefficients (also Moonlight's and MindFormers'): chosen to
# maximise the slope at 0, so 5 steps bring every singular value into roughly [0.7, 1.2].
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
ADJUST_LR_FNS = ("match_rms_adamw", "original")

# Parameters that stay with AdamW even when 2-D: the token embedding table and the output head
# (Muon's authors: their gradients are not "hidden layer" matrices; an embedding row only sees
# its own tokens). mf-models names them `tok_embeddings.weight` / `output.weight`; HF-style names
# (`embed_tokens`, `lm_head`) are covered too. Everything that is not 2-D also stays with AdamW
# (norm scales, biases, 0-d scalars, and the 3-D stacked MoE expert weights).
DEFAULT_ADAMW: tuple[str, ...] = (r"embed", r"(^|\.)output\.", r"lm_head")

_DOC = "see mf-trainer's README, \"Muon\""
_ALIASES = {  # MindFormers' Muon keys that the section's fixed fields already are
    "adamw_betas": "optimizer.betas (Muon's AdamW part uses the section's betas)",
    "adamw_eps": "optimizer.eps (Muon's AdamW part uses the section's eps)",
    "learning_rate": "lr_scheduler.learning_rate (one schedule drives both parts)",
    "lr": "lr_scheduler.learning_rate (one schedule drives both parts)",
}
_NOT_IMPLEMENTED = {
    "qk_clip_threshold": "MuonClip's QK-clip (rescaling q/k projections by the max attention logit) is not "
                         "implemented; remove it",
}


@dataclass(frozen=True)
class MuonOptions:
    """Muon's pass-through keys, with their defaults (Moonlight's recipe: AdamW's LR and weight
    decay transfer because the update is scaled to AdamW's RMS)."""

    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS
    adjust_lr_fn: str = "match_rms_adamw"
    matched_adamw_rms: float = 0.2
    adamw_params: tuple[str, ...] = ()

    def update_scale(self, rows: int, cols: int) -> float:
        """The factor on the orthogonalised update of a [rows, cols] matrix (host, double).

        match_rms_adamw (Moonlight): an orthogonal [A, B] matrix has RMS 1/sqrt(max(A, B)); times
        0.2 * sqrt(max(A, B)) it has RMS 0.2, the typical RMS of an AdamW update. original (Keller
        Jordan): sqrt(max(1, A / B)), so a tall matrix's update has unit spectral norm per column.
        """
        if self.adjust_lr_fn == "original":
            return math.sqrt(max(1.0, rows / cols))
        return self.matched_adamw_rms * math.sqrt(max(rows, cols))


MUON_KEYS = ("momentum", "nesterov", "ns_steps", "ns_coefficients", "adjust_lr_fn", "matched_adamw_rms",
             "adamw_params")


def _number(key: str, value, *, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise TrainerConfigError(f"optimizer.{key}: must be {'an integer' if integer else 'a number'}, got {value!r}")
    if not math.isfinite(value):
        raise TrainerConfigError(f"optimizer.{key}: must be finite, got {value!r}")
    return value


def _patterns(key: str, value) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise TrainerConfigError(f"optimizer.{key}: must be a list of regular expressions, got {value!r}")
    for i, pattern in enumerate(value):
        if not isinstance(pattern, str):
            raise TrainerConfigError(f"optimizer.{key}[{i}]: must be a string (a regular expression), got {pattern!r}")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise TrainerConfigError(f"optimizer.{key}[{i}]: not a valid regular expression {pattern!r}: {exc}") from None
    return tuple(value)


def _muon_options(extra: dict) -> MuonOptions:
    for key in extra:
        if key in _ALIASES:
            raise TrainerConfigError(f"optimizer.{key}: not a Muon key here; use {_ALIASES[key]}")
        if key in _NOT_IMPLEMENTED:
            raise TrainerConfigError(f"optimizer.{key}: {_NOT_IMPLEMENTED[key]}")
        if key not in MUON_KEYS:
            import difflib

            close = difflib.get_close_matches(key, MUON_KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TrainerConfigError(f"optimizer.{key}: Muon takes no such key{hint}; accepted keys: "
                                     f"{', '.join(ADAMW_KEYS + MUON_KEYS)}")
    d = MuonOptions()
    momentum = float(_number("momentum", extra.get("momentum", d.momentum)))
    if not 0.0 <= momentum < 1.0:
        raise TrainerConfigError(f"optimizer.momentum: must be in [0, 1), got {momentum}")
    nesterov = extra.get("nesterov", d.nesterov)
    if not isinstance(nesterov, bool):
        raise TrainerConfigError(f"optimizer.nesterov: must be true or false, got {nesterov!r}")
    ns_steps = int(_number("ns_steps", extra.get("ns_steps", d.ns_steps), integer=True))
    if not 1 <= ns_steps <= 20:
        raise TrainerConfigError(f"optimizer.ns_steps: must be between 1 and 20, got {ns_steps}")
    coeffs = extra.get("ns_coefficients", d.ns_coefficients)
    if not isinstance(coeffs, (list, tuple)) or len(coeffs) != 3:
        raise TrainerConfigError(f"optimizer.ns_coefficients: must be three numbers [a, b, c], got {coeffs!r}")
    coeffs = tuple(float(_number(f"ns_coefficients[{i}]", c)) for i, c in enumerate(coeffs))
    if sum(coeffs) <= 0.0:
        # p(1) = a + b + c is where a singular value of 1 goes: it must stay positive or the
        # iteration flips or kills the update.
        raise TrainerConfigError(f"optimizer.ns_coefficients: a + b + c must be positive (the image of a unit "
                                 f"singular value), got {list(coeffs)}")
    adjust = extra.get("adjust_lr_fn", d.adjust_lr_fn)
    if adjust not in ADJUST_LR_FNS:
        raise TrainerConfigError(f"optimizer.adjust_lr_fn: must be one of {', '.join(ADJUST_LR_FNS)}, got {adjust!r}")
    rms = float(_number("matched_adamw_rms", extra.get("matched_adamw_rms", d.matched_adamw_rms)))
    if "matched_adamw_rms" in extra and adjust != "match_rms_adamw":
        raise TrainerConfigError(f"optimizer.matched_adamw_rms: acts only with adjust_lr_fn: match_rms_adamw, "
                                 f"got adjust_lr_fn {adjust!r}: it would do nothing")
    if not rms > 0.0:
        raise TrainerConfigError(f"optimizer.matched_adamw_rms: must be positive, got {rms}")
    return MuonOptions(momentum=momentum, nesterov=nesterov, ns_steps=ns_steps, ns_coefficients=coeffs,
                       adjust_lr_fn=adjust, matched_adamw_rms=rms,
                       adamw_params=_patterns("adamw_params", extra.get("adamw_params")))


def optimizer_options(cfg) -> MuonOptions | None:
    """Check `cfg` (mf_config's OptimizerConfig): None for AdamW, the Muon options for Muon.
    Raises TrainerConfigError with one keyed line."""
    opt_type = getattr(cfg, "type", "AdamW") or "AdamW"
    extra = dict(getattr(cfg, "extra", None) or {})
    if opt_type == "AdamW":
        if extra:
            raise TrainerConfigError(f"optimizer.{sorted(extra)[0]}: AdamW takes no such key; accepted keys: "
                                     f"{', '.join(ADAMW_KEYS)}")
        return None
    if opt_type == "Muon":
        return _muon_options(extra)
    raise TrainerConfigError(f"optimizer.type: unknown optimizer {opt_type!r}; available: {', '.join(OPTIMIZERS)}")


def muon_mask(names: Sequence[str], shapes: Sequence[Sequence[int]], adamw_params: Sequence[str] = ()) -> list[bool]:
    """For each parameter, whether Muon updates it: 2-D, not an embedding or the head
    (`DEFAULT_ADAMW`), not matched by `optimizer.adamw_params` (regexes, `re.search`). A user
    pattern that matches no parameter is an error (almost always a typo)."""
    defaults = [re.compile(p) for p in DEFAULT_ADAMW]
    user = [(p, re.compile(p)) for p in adamw_params]
    used: set[str] = set()
    mask = []
    for name, shape in zip(names, shapes, strict=True):
        hits = [p for p, rx in user if rx.search(name)]
        used.update(hits)
        mask.append(len(shape) == 2 and not hits and not any(rx.search(name) for rx in defaults))
    for pattern, _ in user:
        if pattern not in used:
            sample = ", ".join(list(names)[:4])
            raise TrainerConfigError(f"optimizer.adamw_params: pattern {pattern!r} matches no parameter (names look "
                                     f"like: {sample}, ...)")
    if not any(mask):
        raise TrainerConfigError("optimizer.type: Muon has no 2-D hidden weight to update in this model (every "
                                 "parameter went to AdamW); use type: AdamW")
    return mask


__all__ = ["ADAMW_KEYS", "DEFAULT_ADAMW", "MUON_KEYS", "NS_COEFFICIENTS", "OPTIMIZERS", "MuonOptions", "muon_mask",
           "optimizer_options"]
