"""`path_warnings`: missing inputs are warned about, never errors."""

from __future__ import annotations

from mf_config import load_config, path_warnings


def _cfg(tmp_path, **extra):
    raw = {"model": {"model_type": "x"}, "training": {},
           "train_dataset": {"dataloader": {"type": "BlendedMegatronDatasetDataLoader",
                                            "config": {"data_path": ["0.7", str(tmp_path / "a"),
                                                                     "0.3", str(tmp_path / "b")]}}}}
    raw.update(extra)
    return load_config(raw)


def test_missing_dataset_files_are_warned_per_prefix(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"")
    (tmp_path / "a.idx").write_bytes(b"")
    (tmp_path / "b.bin").write_bytes(b"")
    warnings = path_warnings(_cfg(tmp_path))
    assert warnings == [f"train_dataset.dataloader.config.data_path: {tmp_path / 'b'}.idx not found"]


def test_every_input_path_is_checked(tmp_path):
    cfg = _cfg(tmp_path, checkpoint={"load_path": str(tmp_path / "ckpt")}, tokenizer={"path": str(tmp_path / "t")},
               inference={"input_file": str(tmp_path / "p.jsonl")},
               eval_dataset={"dataloader": {"type": "BlendedMegatronDatasetDataLoader",
                                            "config": {"data_path": [str(tmp_path / "v")]}}})
    warnings = path_warnings(cfg)
    assert [w.split(":")[0] for w in warnings] == [
        "train_dataset.dataloader.config.data_path", "train_dataset.dataloader.config.data_path",
        "eval_dataset.dataloader.config.data_path", "checkpoint.load_path", "tokenizer.path", "inference.input_file",
    ]
    assert all("\n" not in w for w in warnings)


def test_nothing_to_warn_about(tmp_path):
    for name in ("a", "b"):
        (tmp_path / f"{name}.bin").write_bytes(b"")
        (tmp_path / f"{name}.idx").write_bytes(b"")
    (tmp_path / "ckpt").mkdir()
    assert path_warnings(_cfg(tmp_path, checkpoint={"load_path": str(tmp_path / "ckpt")})) == []


def test_other_loaders_paths_are_theirs_to_check(tmp_path):
    cfg = load_config({"model": {"model_type": "x"}, "training": {},
                       "train_dataset": {"dataloader": {"type": "MyLoader", "config": {"data_path": ["/nope"]}}}})
    assert path_warnings(cfg) == []
