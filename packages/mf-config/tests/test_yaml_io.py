"""Problems with the file itself: syntax (with line and column), duplicates, emptiness, access."""

from __future__ import annotations

import pytest

from mf_config import ConfigError, load_config


def _error(tmp_path, text: str | bytes) -> str:
    path = tmp_path / "bad.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(path) + ": ")
    return message


def test_syntax_error_reports_line_and_column(tmp_path):
    message = _error(tmp_path, "training:\n  steps: 10\n  global_batch_size: [8, 9\nmodel:\n  a: 1\n")
    assert "invalid YAML at line 4, column 6" in message
    assert message.endswith("(while parsing a flow sequence at line 3, column 22)")


def test_unclosed_quote_says_where_it_opened(tmp_path):
    message = _error(tmp_path, 'model:\n  model_type: "qwen3\ntraining: {}\n')
    assert message.endswith("(while scanning a quoted scalar at line 2, column 15)")


def test_bad_indentation_reports_its_line(tmp_path):
    message = _error(tmp_path, "training:\n  steps: 10\n   seed: 3\n")
    assert "invalid YAML at line 3" in message


def test_tab_indentation(tmp_path):
    message = _error(tmp_path, "training:\n\tsteps: 10\n")
    assert "invalid YAML at line 2, column 1" in message


def test_duplicate_key_is_an_error_with_its_line(tmp_path):
    message = _error(tmp_path, "training:\n  steps: 10\n  seed: 1\n  steps: 20\n")
    assert "invalid YAML at line 4, column 3: found duplicate key 'steps'" in message


def test_yaml_merge_keys_are_not_duplicates(tmp_path):
    path = tmp_path / "merge.yaml"
    path.write_text("base: &b\n  steps: 10\n  seed: 1\n", encoding="utf-8")
    text = ("model:\n  model_type: x\ntrain_dataset:\n  dataloader:\n    type: X\n"
            "training:\n  <<: {steps: 10, seed: 1}\n  steps: 20\n")
    path.write_text(text, encoding="utf-8")
    cfg = load_config(path)
    assert (cfg.training.steps, cfg.training.seed) == (20, 1)


def test_empty_file_names_the_required_sections(tmp_path):
    message = _error(tmp_path, "# nothing here\n")
    assert message.endswith("the config is empty; required sections: model, train_dataset, training")


def test_top_level_must_be_a_mapping(tmp_path):
    assert "the top level must be a mapping of sections, got list" in _error(tmp_path, "- training\n- model\n")
    assert "got str" in _error(tmp_path, "just a sentence\n")


def test_several_documents_are_rejected(tmp_path):
    message = _error(tmp_path, "training: {}\n---\nmodel: {}\n")
    assert "invalid YAML at line 2, column 1: expected a single document in the stream but found another" in message


def test_python_tags_are_refused(tmp_path):
    assert "invalid YAML at line 1" in _error(tmp_path, "training: !!python/object:os.system {}\n")


def test_non_utf8_file(tmp_path):
    assert _error(tmp_path, b"training:\n  steps: \xff\xfe\n").endswith("is not UTF-8 text")


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.yaml: no such file$"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match=r": is a directory, not a YAML file$"):
        load_config(tmp_path)


def test_non_string_keys(load_text):
    with pytest.raises(ConfigError, match=r"^training: keys must be strings, got 1$"):
        load_text("training:\n  1: 2\n")
    with pytest.raises(ConfigError, match=r"^top level: keys must be strings, got True$"):
        load_text("true: 1\n")


def test_recursive_alias_in_pass_through_data(load_text):
    with pytest.raises(ConfigError, match=r"^model.self: contains itself \(a recursive YAML alias\)$"):
        load_text("model: &m\n  model_type: x\n  self: *m\n")


def test_alias_bombs_are_refused(load_text):
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 8)]
    fragment = "model:\n  model_type: x\n  " + levels[0] + "\n" + "\n".join(levels[1:]) + "\n"
    with pytest.raises(ConfigError, match=r"^model.a\d\[.*holds more than 1000000 values"):
        load_text(fragment)


def test_shared_aliases_are_written_out_in_full(load_text):
    from mf_config import dump_config

    cfg = load_text("model:\n  model_type: x\n  a: &v [1, 2]\n  b: *v\n")
    text = dump_config(cfg)
    assert "&" not in text and "*" not in text
    assert "  a: [1, 2]\n  b: [1, 2]\n" in text
