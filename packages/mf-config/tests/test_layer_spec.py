"""The shared layer-spec parser and the pipeline layer placement built on it."""

from __future__ import annotations

import pytest

from mf_config import ConfigError, parse_layer_spec, pipeline_layer_placement


@pytest.mark.parametrize(("specs", "layers"), [
    (["0-3"], [0, 1, 2, 3]),            # closed range: four layers
    (["0", "5"], [0, 5]),
    (["0-1", "3-4", "7"], [0, 1, 3, 4, 7]),
    ([" 2 - 4 "], [2, 3, 4]),
    (["6-6"], [6]),
    ([], []),
])
def test_parse(specs, layers):
    assert parse_layer_spec(specs, 8, "x") == layers


@pytest.mark.parametrize(("specs", "path", "text"), [
    (["3", "1"], "x[1]", "sorted strictly ascending"),
    (["0-3", "2-5"], "x[1]", "must not overlap (the previous spec ends at layer 3)"),
    (["0-3", "3"], "x[1]", "must not overlap"),
    (["8"], "x[0]", "out of range: model.num_hidden_layers is 8 (valid layers 0-7), got '8'"),
    (["5-3"], "x[0]", "range end 3 is below its start 5"),
    (["-1"], "x[0]", "'N' or 'A-B'"),
    (["a-b"], "x[0]", "'N' or 'A-B'"),
    (["0-3-5"], "x[0]", "'N' or 'A-B'"),
    ([5], "x[0]", "quoted string such as '5' or '0-3' (write '5' in quotes)"),
    ([True], "x[0]", "quoted string"),
    ("0-3", "x", "must be a list of layer specs"),
    (["0-1000000"], "x[0]", "implausibly large"),
])
def test_parse_errors(specs, path, text):
    with pytest.raises(ConfigError) as info:
        parse_layer_spec(specs, None if "large" in text else 8, "x")
    assert str(info.value).startswith(path + ":") and text in str(info.value), str(info.value)


def test_unknown_layer_count_skips_only_the_range_check():
    assert parse_layer_spec(["10-11"], None, "x") == [10, 11]
    with pytest.raises(ConfigError, match="sorted"):
        parse_layer_spec(["10", "2"], None, "x")


def test_placement_auto_counts_and_ranges():
    assert pipeline_layer_placement("auto", 2, 1, 4) == [[0, 1], [2, 3]]
    assert pipeline_layer_placement(None, 2, 2, 8) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert pipeline_layer_placement([1, 3], 2, 1, 4) == [[0], [1, 2, 3]]
    # the reference manual's example: chunk k of stage i is virtual stage k * pp + i
    assert pipeline_layer_placement(["0-1, 4-8", "2-3, 9"], 2, 2, 10) == [[0, 1], [2, 3], [4, 5, 6, 7, 8], [9]]


@pytest.mark.parametrize(("value", "pp", "chunks", "layers", "text"), [
    ("auto", 3, 3, 8, "at least one layer per virtual stage"),
    ("even", 2, 1, 8, "must be 'auto'"),
    ([4, 4], 2, 2, 8, "one layer count per virtual stage"),
    ([4, 0], 2, 1, 4, "at least one layer"),
    ([3, 3], 2, 1, 8, "sum to 6"),
    (["0-3"], 2, 1, 8, "one entry per pipeline stage"),
    (["0-3", "4-7, 8"], 2, 1, 9, "needs 1 comma-separated layer range"),
    (["0-3", "5-7"], 2, 1, 8, "virtual stage 1 must start at layer 4"),
    (["0-3", "4-6"], 2, 1, 8, "cover layers 0-6 but model.num_hidden_layers is 8"),
    ([], 2, 1, 8, "non-empty list"),
    ([1.5, 2], 2, 1, 8, "layer count (int) or a layer-range string"),
])
def test_placement_errors(value, pp, chunks, layers, text):
    with pytest.raises(ConfigError) as info:
        pipeline_layer_placement(value, pp, chunks, layers)
    assert str(info.value).startswith("parallelism.pipeline_parallel_layers_per_stage"), str(info.value)
    assert text in str(info.value), str(info.value)
