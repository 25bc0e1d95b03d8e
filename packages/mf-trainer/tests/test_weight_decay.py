"""Which parameters decay: defaults, include/exclude regexes, and the errors for bad patterns."""

import pytest

from mf_trainer.errors import TrainerConfigError
from mf_trainer.weight_decay import decay_mask, unmatched_patterns

NAMES = [
    "tok_embeddings.weight",
    "layers.0.attention_norm.weight",
    "layers.0.attention.wq.weight",
    "layers.0.attention.wq.bias",
    "layers.0.feed_forward.w1.weight",
    "norm.weight",
    "output.weight",
]


def test_norms_and_biases_are_excluded_by_default():
    assert decay_mask(NAMES) == [True, False, True, False, True, False, True]


def test_exclude_adds_to_the_defaults_and_include_re_enables_a_default_exclusion():
    mask = decay_mask(NAMES, include=[r"^norm\.weight$"], exclude=["tok_embeddings", r"^output\."])
    assert mask == [False, False, True, False, True, True, False]


def test_a_name_matched_by_both_lists_is_an_error():
    with pytest.raises(TrainerConfigError, match="matches both weight_decay_include 'wq' and weight_decay_exclude 'attention'"):
        decay_mask(NAMES, include=["wq"], exclude=["attention"])


def test_patterns_matching_nothing_are_listed_per_key():
    assert unmatched_patterns(NAMES, exclude=["bias", "nrom"]) == {"weight_decay_exclude": ["nrom"]}
    assert unmatched_patterns(NAMES, include=["wq"], exclude=["xyz"]) == {"weight_decay_include": [],
                                                                         "weight_decay_exclude": ["xyz"]}
    assert unmatched_patterns(NAMES) == {}
    # decay_mask applies what matches and leaves the question to the preflight (a stage sees some names)
    assert decay_mask(NAMES, exclude=["nrom"]) == decay_mask(NAMES)


def test_an_invalid_regex_names_its_key_and_index():
    with pytest.raises(TrainerConfigError, match=r"optimizer.weight_decay_include\[1\]: not a valid regular expression"):
        decay_mask(NAMES, include=["wq", "(unclosed"])
