"""The configuration reference's YAML examples as a user would run them: each section's example
(examples/reference/, verbatim copies of seeds/000's blocks) laid over the reference's complete
skeleton (examples/skeleton.yaml), with only the data path pointed at the demo corpus, passes
`mf train --dry-run` at its own world size, on CPU and with `--device Ascend`: "one YAML drives a
laptop CPU and an Ascend cluster". A knob with nothing to act on there is a notice, never a refusal.

The user-defined `MyCustomCallback` example is the one left out: it names a class the user writes
and registers (mf-trainer's `register_callback`), which no reference example can ship.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = sorted((ROOT / "examples" / "reference").glob("[0-9][0-9]_*.yaml"))
LEFT_OUT = {"15_callbacks": "names the user's own callback class (MyCustomCallback), which must be registered first"}

# Each example's own world: the skeleton's is global_batch_size / local_batch_size = 8 data-parallel
# ranks; the training example's 16 / 2 = 8 as well; the parallelism example is TP 2 x PP 2 x EP 8,
# which needs 32 ranks (FSDP 8 under each of the 4 tp x pp positions, the 8 experts over them).
WORLD = {"03_parallelism": 32}


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = _deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


@pytest.fixture(scope="module")
def demo_prefix(tmp_path_factory) -> str:
    """The demo corpus (Python's pydoc topics, tokenised as the demo does) built by mf-data."""
    import mf_data

    cache = tmp_path_factory.mktemp("demo_corpus")
    info = mf_data.make_demo_corpus(str(cache))
    spm = str(cache / "pydoc_spm.model")
    mf_data.train_sentencepiece([info["path"]], spm, 2000)
    mf_data.preprocess([info["path"]], spm, str(cache / "pydoc"), append_eod=True, workers=1, overwrite=True,
                       progress=False, log=io.StringIO())
    return str(cache / "pydoc_text_document")


def _mf(cwd, *args):
    exe = shutil.which("mf", path=os.path.dirname(sys.executable))
    command = [exe] if exe else [sys.executable, "-m", "mf_cli.main"]
    return subprocess.run([*command, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "GLOG_v": "3"}, timeout=300)


def _laid_over_the_skeleton(example: Path | None, prefix: str) -> dict:
    skeleton = yaml.safe_load((ROOT / "examples" / "skeleton.yaml").read_text(encoding="utf-8"))
    merged = _deep_merge(skeleton, yaml.safe_load(example.read_text(encoding="utf-8"))) if example else skeleton
    merged["train_dataset"]["dataloader"]["config"]["data_path"] = ["1", prefix]
    return merged


CASES = [None, *[p for p in REFERENCE if p.stem not in LEFT_OUT]]


@pytest.mark.parametrize("example", CASES, ids=["skeleton", *[p.stem for p in CASES[1:]]])
@pytest.mark.parametrize("device", ["CPU", "Ascend"])
def test_each_reference_example_dry_runs_at_its_own_world(tmp_path, demo_prefix, example, device):
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump(_laid_over_the_skeleton(example, demo_prefix), allow_unicode=True))
    world = WORLD.get(example.stem if example else "skeleton", 8)
    done = _mf(tmp_path, "train", config, "--dry-run", "--world", world, "--device", device)
    assert done.returncode == 0, f"{example}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    out = done.stdout
    assert "would run 1000 steps; nothing was written" in out or "would run 2000 steps" in out, out
    assert not list(tmp_path.glob("output*")), "a dry run writes nothing"


def test_every_reference_block_is_here_or_left_out_with_a_reason():
    names = {p.stem for p in REFERENCE}
    assert len(names) == 15 and set(LEFT_OUT) <= names
