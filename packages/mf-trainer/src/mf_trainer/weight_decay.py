"""Which parameters get weight decay.

Patterns are Python regular expressions matched with `re.search` anywhere in the parameter name,
so the seed's `weight_decay_exclude: ["bias", "norm"]` means "any name containing bias or norm",
and anchors give exact control (`"^output\\.weight$"`). Regex rather than glob because the seed's
examples are bare substrings, which a glob would only match with `*` on both sides.

Order of precedence, first match wins:
  1. a name matched by both `weight_decay_include` and `weight_decay_exclude` is an error;
  2. `weight_decay_exclude` match -> no decay;
  3. `weight_decay_include` match -> decay (this is how to re-enable a default exclusion);
  4. the default exclusions `DEFAULT_EXCLUDE` (biases and norm scales) -> no decay;
  5. everything else -> decay.
Which patterns match nothing is the preflight's question (`unmatched_patterns` over the whole
model's parameter names, preflight/optimizer.py), not this function's: a pipeline stage or a LoRA
run sees only some names. A pattern that matches no parameter of the model is a notice (the
reference's `["bias", "norm"]` on a model without biases); a list none of whose patterns matches
anything is an error (almost always a typo).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from mf_trainer.errors import TrainerConfigError

# Biases and normalisation scales: decaying them towards 0 only hurts (Loshchilov & Hutter; every
# mainstream recipe excludes them). mf-models names them `*.bias` and `*norm*.weight`.
DEFAULT_EXCLUDE: tuple[str, ...] = (r"\.bias$", r"norm")


def _compile(patterns: Sequence[str] | None, key: str) -> list[tuple[str, re.Pattern]]:
    compiled = []
    for i, pattern in enumerate(patterns or ()):
        if not isinstance(pattern, str):
            raise TrainerConfigError(f"{key}[{i}]: must be a string (a regular expression), got {pattern!r}")
        try:
            compiled.append((pattern, re.compile(pattern)))
        except re.error as exc:
            raise TrainerConfigError(f"{key}[{i}]: not a valid regular expression {pattern!r}: {exc}") from None
    return compiled


def decay_mask(
    names: Sequence[str],
    include: Sequence[str] | None = None,
    exclude: Sequence[str] | None = None,
) -> list[bool]:
    """For each parameter name, whether weight decay applies to it (see the module docstring)."""
    inc = _compile(include, "optimizer.weight_decay_include")
    exc = _compile(exclude, "optimizer.weight_decay_exclude")
    defaults = [re.compile(p) for p in DEFAULT_EXCLUDE]
    used: set[str] = set()
    mask = []
    for name in names:
        hit_inc = [p for p, rx in inc if rx.search(name)]
        hit_exc = [p for p, rx in exc if rx.search(name)]
        used.update(hit_inc, hit_exc)
        if hit_inc and hit_exc:
            raise TrainerConfigError(
                f"optimizer: parameter {name!r} matches both weight_decay_include {hit_inc[0]!r} "
                f"and weight_decay_exclude {hit_exc[0]!r}; make the patterns disjoint")
        if hit_exc:
            mask.append(False)
        elif hit_inc:
            mask.append(True)
        else:
            mask.append(not any(rx.search(name) for rx in defaults))
    return mask


def unmatched_patterns(names: Sequence[str], include: Sequence[str] | None = None,
                       exclude: Sequence[str] | None = None) -> dict[str, list[str]]:
    """{"weight_decay_include" / "weight_decay_exclude": [patterns matching none of `names`]} for
    the lists given (an invalid pattern raises TrainerConfigError, as in `decay_mask`)."""
    out: dict[str, list[str]] = {}
    for key, patterns in (("weight_decay_include", include), ("weight_decay_exclude", exclude)):
        compiled = _compile(patterns, f"optimizer.{key}")
        if compiled:
            out[key] = [pattern for pattern, rx in compiled if not any(rx.search(name) for name in names)]
    return out
