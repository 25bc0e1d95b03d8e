"""Damaged checkpoints through the real commands: every case is one line naming the file and the
field, exit status 2, never a traceback, nothing written; `load` (what `mf train` resume and
`mf generate` call) raises the same one-line CheckpointError.

The table below is the red-team list of issue 17 (deep nesting, tagged values jsonable cannot
decode, odd markers, wrong types in metadata.json / common.json, flipped bytes and swapped chunk
keys); each case runs through inspect / verify / merge / convert (in-process `main`, the console
script's entry point) and `load`, and a few through the installed console script itself.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mf_ckpt import CheckpointError, load
from mf_ckpt.cli import main

SCRIPT = Path(sys.executable).with_name("mf-ckpt")
IT = "iteration_00000000"
FILE = "checkpoint-model-0000000-0000001.safetensors"


@pytest.fixture(scope="module")
def pristine(hf_fixtures, tmp_path_factory) -> Path:
    """The llama fixture as an mf checkpoint (one rank, checksums recorded)."""
    out = tmp_path_factory.mktemp("pristine") / "ck"
    assert main(["convert", "--from", "hf", "--to", "mf", "--arch", "llama", str(hf_fixtures / "llama"), str(out)]) == 0
    return out


# ---- ways to damage a checkpoint -----------------------------------------------------------
def _edit_json(name: str, fn):
    def edit(ck: Path) -> None:
        path = ck / IT / name
        obj = json.loads(path.read_text())
        fn(obj)
        path.write_text(json.dumps(obj))
    return edit


def _write(name: str, data: bytes):
    def edit(ck: Path) -> None:
        (ck / (name if name.startswith("latest") else f"{IT}/{name}")).write_bytes(data)
    return edit


def _common(**values):
    return _edit_json("common.json", lambda c: c["common"].update(values))


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _deep_header(ck: Path) -> None:
    path = ck / IT / FILE
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = (_nested(100_000)).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + data[8 + n:])


def _flip_byte(ck: Path) -> None:
    meta = json.loads((ck / IT / "metadata.json").read_text())
    path = ck / IT / FILE
    data = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    start = 8 + n + header[meta["model"]["layers.1.attention.wq.weight"]["chunks"][0]["key"]]["data_offsets"][0]
    data[start + 123] ^= 0x10
    path.write_bytes(bytes(data))


def _swap_keys(meta: dict) -> None:
    # Two tensors of the same shape and dtype: every structural check passes, only the data differs.
    a, b = meta["model"]["layers.0.attention.wq.weight"], meta["model"]["layers.0.attention.wo.weight"]
    a["chunks"][0]["key"], b["chunks"][0]["key"] = b["chunks"][0]["key"], a["chunks"][0]["key"]


def _secret_marker(ck: Path) -> None:
    secret = ck.parent / "secret.txt"
    secret.write_text("SECRET-TOKEN-0123 do not print me\n")
    (ck / "latest_checkpointed_iteration.txt").unlink()
    (ck / "latest_checkpointed_iteration.txt").symlink_to(secret)


ALL = ("inspect", "verify", "merge", "convert", "load")
DATA = ("verify", "merge", "convert", "load")   # only commands that read tensor data can see these
CASES = [
    # (id, damage, what the one line must contain, commands that must refuse)
    ("metadata-deep-nesting", _write("metadata.json", ('{"format": "mf-ckpt", "model": ' + _nested(100_000) + "}").encode()),
     ["metadata.json", "nests too deeply"], ALL),
    ("metadata-nested-200", _edit_json("metadata.json", lambda m: m.update(extra=json.loads(_nested(200)))),
     ["metadata.json", "nests more than 64 levels"], ALL),
    ("common-deep-nesting", _write("common.json", ('{"common": ' + _nested(100_000) + "}").encode()),
     ["common.json", "nests too deeply"], ALL),
    ("safetensors-header-deep-nesting", _deep_header, [FILE, "safetensors header nests too deeply"], DATA),
    ("ndarray-bogus-dtype", _common(rng={"__mf__": "ndarray", "dtype": "bogus", "shape": [1], "data": ""}),
     ["common.json", "common.rng.dtype", "'bogus'"], ALL),
    ("ndarray-object-dtype", _common(rng={"__mf__": "ndarray", "dtype": "|O", "shape": [1], "data": "AAAAAAAAAAA="}),
     ["common.json", "common.rng.dtype"], ALL),
    ("ndarray-wrong-shape", _common(rng={"__mf__": "tuple", "items": ["MT19937", {"__mf__": "ndarray", "dtype": "<u4",
                                                                                "shape": [624], "data": "AAAAAA=="}]}),
     ["common.json", "common.rng[1]", "do not fill"], ALL),
    ("ndarray-negative-shape", _common(rng={"__mf__": "ndarray", "dtype": "<f4", "shape": [-1], "data": ""}),
     ["common.json", "common.rng.shape"], ALL),
    ("ndarray-missing-fields", _common(rng={"__mf__": "ndarray", "dtype": "<f4"}),
     ["common.json", "common.rng", "lacks 'data'"], ALL),
    ("bytes-bad-base64", _common(rng={"__mf__": "bytes", "data": "not base64!"}),
     ["common.json", "common.rng.data", "not valid base64"], ALL),
    ("tuple-items-not-a-list", _common(rng={"__mf__": "tuple", "items": 5}), ["common.json", "common.rng"], ALL),
    ("unknown-tag", _common(rng={"__mf__": "pickle", "data": "gASV"}), ["common.json", "unknown tag 'pickle'"], ALL),
    ("marker-superscript", _write("latest_checkpointed_iteration.txt", "³".encode()),
     ["latest_checkpointed_iteration.txt", "does not hold an iteration number"], ALL),
    ("marker-5000-digits", _write("latest_checkpointed_iteration.txt", b"9" * 5000),
     ["latest_checkpointed_iteration.txt", "more than 24 bytes"], ALL),
    ("marker-negative", _write("latest_checkpointed_iteration.txt", b"-1\n"),
     ["latest_checkpointed_iteration.txt", "does not hold an iteration number"], ALL),
    ("marker-symlink-to-another-file", _secret_marker, ["latest_checkpointed_iteration.txt"], ALL),
    ("files-not-a-list", _edit_json("metadata.json", lambda m: m.update(files=5)), ["metadata.json", "files must be a list"], ALL),
    ("format-version-string", _edit_json("metadata.json", lambda m: m.update(format_version="1")),
     ["metadata.json", "format_version must be a positive integer"], ALL),
    ("world-size-negative", _edit_json("metadata.json", lambda m: m.update(world_size=-1)),
     ["metadata.json", "world_size must be a positive integer"], ALL),
    ("metadata-a-list", _write("metadata.json", b"[1, 2]"), ["metadata.json", "not an mf-ckpt metadata file"], ALL),
    ("metadata-truncated", _write("metadata.json", b'{"format": "mf-ckpt", "mod'), ["metadata.json", "not valid JSON"], ALL),
    ("checksum-algorithm-unknown", _edit_json("metadata.json", lambda m: m["checksums"].update(algorithm="md5")),
     ["metadata.json", "checksums.algorithm 'md5'"], ALL),
    ("checksum-not-hex", _edit_json("metadata.json", lambda m: m["checksums"]["model"].update(
        {"layers.0.ffn_norm.weight": ["xyz"]})), ["metadata.json", "checksums.model['layers.0.ffn_norm.weight']"], ALL),
    ("checksum-missing-for-a-tensor", _edit_json("metadata.json", lambda m: m["checksums"]["model"].pop("norm.weight")),
     ["metadata.json", "'norm.weight' has 1 chunk(s) but no checksum(s)"], ALL),
    ("common-a-list", _edit_json("common.json", lambda c: c.update(common=[1, 2])),
     ["common.json", "'common' must be an object, got list"], ALL),
    ("common-json-a-string", _write("common.json", b'"hello"'), ["common.json", "must be a JSON object"], ALL),
    ("per-rank-not-a-list", _edit_json("common.json", lambda c: c.update(per_rank=5)),
     ["common.json", "'per_rank' must be a list"], ALL),
    ("common-json-not-utf8", _write("common.json", b'{"common": "\xff\xfe"}'), ["common.json", "not valid JSON"], ALL),
    ("flipped-byte-in-tensor-data", _flip_byte,
     [FILE, "layers.1.attention.wq.weight", "checksum mismatch"], DATA),
    ("chunk-key-swapped-with-same-shape-tensor", _edit_json("metadata.json", _swap_keys),
     [FILE, "checksum mismatch", "points this chunk at other data"], DATA),
]


def every_tensor(ck: Path) -> dict[str, np.ndarray]:
    meta = json.loads((ck / IT / "metadata.json").read_text())["model"]
    return {name: np.zeros(t["shape"], np.float32) for name, t in meta.items()}


def assert_one_line(err: str, needles) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mf-ckpt: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "SECRET" not in lines[0]
    return lines[0]


def command(name: str, ck: Path, out: Path) -> list[str]:
    return {"inspect": ["inspect", str(ck)], "verify": ["verify", str(ck)], "merge": ["merge", str(ck), str(out)],
            "convert": ["convert", "--from", "mf", "--to", "hf", str(ck), str(out)]}[name]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_damaged_checkpoint_is_one_line_exit_2(pristine, tmp_path, capsys, case):
    _, damage, needles, refusing = case
    ck = tmp_path / "ck"
    shutil.copytree(pristine, ck, symlinks=True)
    damage(ck)
    before = sorted(p.name for p in tmp_path.iterdir())
    for name in ("inspect", "verify", "merge", "convert"):
        out = tmp_path / f"out-{name}"
        code = main(command(name, ck, out))
        err = capsys.readouterr().err
        if name in refusing:
            assert code == 2, (name, err)
            assert_one_line(err, needles)
            assert not out.exists()
        else:
            assert code == 0, (name, err)
            shutil.rmtree(out, ignore_errors=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no temp directories left behind
    if "load" in refusing:
        with pytest.raises(CheckpointError) as info:
            load(str(ck), every_tensor(pristine))
        assert "\n" not in str(info.value) and all(n in str(info.value) for n in needles[:1])


def test_the_table_leaves_nothing_uncaught(pristine, tmp_path):
    """Skipping the check is an explicit choice: the swapped key then loads the wrong tensor."""
    ck = tmp_path / "ck"
    shutil.copytree(pristine, ck)
    _edit_json("metadata.json", _swap_keys)(ck)
    good = {"layers.0.attention.wq.weight": np.zeros((96, 96), np.float32)}
    load(str(pristine), good, strict=False)
    swapped = {"layers.0.attention.wq.weight": np.zeros((96, 96), np.float32)}
    from mf_ckpt import LoadOptions

    load(LoadOptions(load_path=str(ck), verify_checksums=False), swapped, strict=False)
    assert not np.array_equal(good["layers.0.attention.wq.weight"], swapped["layers.0.attention.wq.weight"])


@pytest.mark.parametrize("case_id", ["metadata-deep-nesting", "safetensors-header-deep-nesting", "marker-5000-digits",
                                     "chunk-key-swapped-with-same-shape-tensor"])
def test_in_a_real_process(pristine, tmp_path, case_id):
    _, damage, needles, _ = next(c for c in CASES if c[0] == case_id)
    ck = tmp_path / "ck"
    shutil.copytree(pristine, ck)
    damage(ck)
    r = subprocess.run([str(SCRIPT), "verify", str(ck)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert_one_line(r.stderr, needles)


def test_checkpoint_without_checksums_still_loads_and_verify_says_so(pristine, tmp_path, capsys):
    ck = tmp_path / "old"
    shutil.copytree(pristine, ck)
    _edit_json("metadata.json", lambda m: m.pop("checksums"))(ck)
    assert main(["verify", str(ck)]) == 0
    assert "no checksums recorded (written before mf-ckpt 0.3)" in capsys.readouterr().out
    dest = {"norm.weight": np.zeros(96, np.float32)}
    result = load(str(ck), dest, strict=False)
    assert result.checksums_verified == 0 and dest["norm.weight"].any()
    assert load(str(pristine), dest, strict=False).checksums_verified == 1


@pytest.mark.parametrize("args", [
    ["merge", "{ck}", "{ck}", "--force"],
    ["merge", "{ck}", "{parent}", "--force"],                      # the parent of the source
    ["merge", "{ck}", "{ck}/" + IT, "--force"],                      # inside the source
    ["merge", "{link}", "{ck}", "--force"],                          # the same directory through a symlink
    ["convert", "--from", "mf", "--to", "hf", "{ck}", "{ck}", "--force"],
    ["convert", "--from", "mf", "--to", "hf", "{ck}", "{parent}", "--force"],
    ["convert", "--from", "hf", "--to", "mf", "--arch", "llama", "{ck}", "{ck}", "--force"],
    ["merge-lora", "{ck}", "{adapter}", "{ck}", "--force"],
    ["merge-lora", "{ck}", "{adapter}", "{adapter}", "--force"],
    ["merge-lora", "{ck}", "{adapter}", "{parent}", "--force"],
])
def test_force_never_destroys_its_input(pristine, tmp_path, capsys, args):
    parent = tmp_path / "p"
    ck = parent / "ck"
    shutil.copytree(pristine, ck)
    (parent / "adapter").mkdir()
    os.symlink(ck, tmp_path / "link")
    before = {p: p.read_bytes() for p in ck.rglob("*") if p.is_file()}
    argv = [a.format(ck=ck, parent=parent, adapter=parent / "adapter", link=tmp_path / "link") for a in args]
    assert main(argv) == 2
    assert_one_line(capsys.readouterr().err, ["input"])
    assert {p: p.read_bytes() for p in ck.rglob("*") if p.is_file()} == before
    assert main(["verify", str(ck)]) == 0
