"""Every command of README.md and examples/README.md, run as a user types it.

The commands are read from the documents themselves: each `mf ...` or `./bootstrap ...` line of a
fenced shell block and each such inline command. Each is either run here as written, in the
order a user meets them, in a scratch copy of the repository (training commands shortened only
by appending `--set training.steps=N`), or listed in NOT_RUN with the reason it cannot be (a
placeholder, the suite itself). A command added to a README is then tested by being written:
`test_every_documented_command_is_run_or_said_why_not` fails until it is one or the other.

The commands share the state a user's session would have: the demo's run is what the README's
`mf report`, `mf eval`, the LoRA fine-tune and the HF export read. One scenario, one test per
command (in order; a failure names the command and its output).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "README.md", ROOT / "examples" / "README.md")
STEPS = ("--set", "training.steps=4")


def documented_commands() -> list[str]:
    """The `mf` / `./bootstrap` commands of DOCS: fenced shell lines (trailing `#` comments
    dropped) and inline code spans, whitespace-normalised, in order, each once."""
    found: list[str] = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for block in re.findall(r"```(?:bash|sh|shell|console)\n(.*?)```", text, re.S):
            for line in block.splitlines():
                line = re.sub(r"\s+#.*$", "", line).strip()
                if line.startswith(("mf ", "./bootstrap ")):
                    found.append(" ".join(line.split()))
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        for span in re.findall(r"`([^`]+)`", prose):
            span = " ".join(span.split())
            if span.startswith(("mf ", "./bootstrap ")) or span in ("mf", "./bootstrap"):
                found.append(span)
    return list(dict.fromkeys(found))


# Commands that are not run here, and why.
NOT_RUN = {
    "./bootstrap test": "the test suite itself (CI runs exactly this command)",
    "./bootstrap nox -s mf-data": "one session of this suite (it runs as part of ./bootstrap test)",
    "./bootstrap nox -s hf_interop": "its own nox session (transformers and peft in their own venv)",
    "mf": "names the command in prose",
    "mf train": "names the command in prose",
    "mf launch": "names the command in prose",
    "mf generate": "names the command in prose",
    "mf ckpt merge-lora": "names the command in prose",
    "mf train --dry-run": "names the command in prose",
    "mf plan CONFIG": "a placeholder (`mf plan train.yaml` runs below)",
    "mf report A B --compare": "a placeholder for two run directories (the compare is mf-cli's test_report_command)",
    "mf train FILE --dry-run --world N": "a placeholder: each preset's dry run at its world is test_examples.py's",
    "mf serve": "names the command in prose (test_serve.py and test_lm_eval.py run the server)",
    "mf eval output/tiny/checkpoint --tasks arc_easy": "arc_easy is fetched from the Hugging Face hub, which this "
                                                       "machine cannot reach; test_lm_eval.py runs the same command "
                                                       "form on a local task",
    "mf train train.yaml": "train.yaml is the reference's skeleton, a cluster-size DeepSeek-V3 (its dry run runs below)",
    "mf launch -n 8 train.yaml": "8 ranks of the reference's cluster-size skeleton (its dry run at world 8 runs below)",
    "mf launch -n 2 --nodes 2 --node-rank 0 --master-addr 10.231.0.1 --master-port 29500 train.yaml":
        "node 0 of two machines: test_multinode.py runs it as written, beside node 1's, in two network namespaces",
    "mf launch -n 2 --nodes 2 --node-rank 1 --master-addr 10.231.0.1 --master-port 29500 train.yaml":
        "node 1 of two machines: test_multinode.py runs it as written, beside node 0's, in two network namespaces",
}


def _env() -> dict:
    bin_dir = os.path.dirname(sys.executable)
    return {**os.environ, "GLOG_v": "3", "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")])}


class Session:
    """A user's shell in a scratch copy of the repository: examples/, the bootstrap script and the
    package manifests it hashes, and the checkout's .venv (the README's first command made it)."""

    def __init__(self, work: Path):
        self.work = work
        self.ran: dict[str, subprocess.CompletedProcess] = {}
        self.seconds: dict[str, float] = {}

    def run(self, command: str, *appended: str, timeout: int = 1200) -> subprocess.CompletedProcess:
        argv = shlex.split(command) + list(appended)
        if argv[0] == "mf":
            exe = shutil.which("mf", path=os.path.dirname(sys.executable))
            argv[0:1] = [exe] if exe else [sys.executable, "-m", "mf_cli.main"]
        start = time.monotonic()
        done = subprocess.run(argv, cwd=self.work, capture_output=True, text=True, env=_env(), timeout=timeout)
        self.seconds[command] = time.monotonic() - start
        self.ran[command] = done
        assert done.returncode == 0, (f"`{command}{' ' + ' '.join(appended) if appended else ''}` exited "
                                      f"{done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
        return done


@pytest.fixture(scope="module")
def session(scratch):
    work = scratch / "readme"
    work.mkdir()
    shutil.copytree(ROOT / "examples", work / "examples", ignore=shutil.ignore_patterns("cache"))
    shutil.copy2(ROOT / "bootstrap", work / "bootstrap")
    for manifest in ROOT.glob("packages/*/pyproject.toml"):     # what bootstrap's freshness stamp hashes
        (work / manifest.parent.relative_to(ROOT)).mkdir(parents=True)
        shutil.copy2(manifest, work / manifest.relative_to(ROOT))
    venv = ROOT / ".venv"
    if not (venv / "bin" / "mf").exists():
        pytest.fail(f"{venv} is missing: the README's ./bootstrap commands run from the venv ./bootstrap setup "
                    "makes (CI's ./bootstrap test makes it first)")
    (work / ".venv").symlink_to(venv)
    # `train.yaml` in the README is the reference's skeleton, saved as the reference says to
    shutil.copy2(ROOT / "examples" / "skeleton.yaml", work / "train.yaml")
    s = Session(work)
    yield s
    print("\nREADME commands (seconds): " + ", ".join(f"{c!r} {t:.0f}" for c, t in s.seconds.items()))


def _metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _eval_loss(stdout: str) -> float:
    """The loss of `mf eval`'s summary line (`mf eval: loss 6.1234, ppl ...`)."""
    return float(re.search(r"^mf eval: loss ([0-9.]+),", stdout, re.M).group(1))


def _steps(run: Path) -> list[int]:
    return [r["step"] for r in _metrics(run / "metrics.jsonl") if "loss" in r]


# ---------------------------------------------------------------------------------- the scenario
# In the order of the READMEs; each test depends on the ones before it (a user's session).

def test_bootstrap_demo(session):
    """The README's first command: the demo corpus, tokenizer and data built, 4 steps trained, the
    held-out split evaluated at the last step (its eval_interval 100 is beyond a short run), the
    run directory explaining itself, two samples."""
    out = session.run("./bootstrap demo", *STEPS).stdout
    run = session.work / "output" / "tiny"
    lines = out.splitlines()
    first = [x for x in lines if x.startswith("[mf_trainer] ")][:6]
    assert first == ["[mf_trainer] output_dir: output/tiny (the resolved config.yaml; summary.json at the end)",
                     "[mf_trainer] metrics: output/tiny/metrics.jsonl",
                     "[mf_trainer] tensorboard: output/tiny/tensorboard",
                     "[mf_trainer] log: output/tiny/train.log",
                     "[mf_trainer] checkpoints: output/tiny/checkpoint (every 100 steps and at the end, 2 kept)",
                     "[mf_trainer] a new run"], first
    assert "demo corpus: trained a 2000-piece sentencepiece model" in out
    assert "[mf_data] train_dataset: " in out and "[mf_data] eval_dataset (valid split): " in out
    assert "eval at step 4: loss" in out and "mf train: done at step 4" in out
    assert not [x for x in lines if "notice: " in x], "the demo as written has no knob with nothing to act on"
    assert _steps(run) == [1, 2, 3, 4]
    evals = [r for r in _metrics(run / "metrics.jsonl") if "eval_loss" in r]
    assert [r["step"] for r in evals] == [4] and evals[0]["eval_batches"] == 2
    for i, prompt in enumerate(("The for statement", "A class definition"), start=1):
        at = lines.index(f"[mf_trainer] sample {i}/2")
        assert lines[at + 1] == f"  prompt     | {prompt}" and lines[at + 2].startswith("  completion | ")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["step"] == 4 and summary["sessions"] == 1
    assert summary["last_checkpoint"]["path"].endswith("iteration_00000004")
    assert (run / "config.yaml").is_file()
    assert (run / "train.log").read_text().count(" [mf_trainer] step ") == out.count("[mf_trainer] step ") >= 2


def test_the_demo_command_again_continues_it(session):
    out = session.run("mf train examples/tiny/train.yaml", "--set", "training.steps=5").stdout
    assert "mf train: done at step 5" in out and "resum" in out


def test_bootstrap_demo_with_fewer_steps_continues_the_run(session):
    out = session.run("./bootstrap demo --set training.steps=50", "--set", "training.steps=6").stdout
    assert "mf train: done at step 6" in out and "eval at step 6" in out
    assert _steps(session.work / "output" / "tiny") == [1, 2, 3, 4, 5, 6]


def test_report_of_the_demo(session):
    out = session.run("mf report output/tiny").stdout
    assert out.startswith("tiny (") and "steps 1-6 (6 recorded, 0 skipped); wall time " in out
    # checkpoint records hold absolute paths, so the report finds them from any directory
    assert re.search(r"last checkpoint: step 6, /\S*/output/tiny/checkpoint/iteration_00000006 \(on disk", out), out


def test_eval_of_the_training_yaml(session):
    """The run's own weights on the held-out split: the evaluation the run logged at its last step."""
    done = session.run("mf eval examples/tiny/train.yaml")
    assert "weights: output/tiny/checkpoint (the run's trained weights: checkpoint.save_path, iteration 6)" in done.stderr
    last = [r for r in _metrics(session.work / "output" / "tiny" / "metrics.jsonl") if "eval_loss" in r][-1]
    assert last["step"] == 6 and _eval_loss(done.stdout) == pytest.approx(last["eval_loss"], rel=1e-4), done.stdout


def test_training_continues_with_more_steps(session):
    out = session.run("mf train examples/tiny/train.yaml --set training.steps=600", "--set", "training.steps=8").stdout
    assert "mf train: done at step 8" in out


def test_the_run_directorys_config_is_the_same_run(session):
    out = session.run("mf train output/tiny/config.yaml", "--set", "training.steps=9").stdout
    assert "mf train: done at step 9" in out


def _launch(session, command: str, out_dir: str, *expected: str):
    console = session.run(command, *STEPS).stdout
    assert "mf train: done at step 4" in console, console[-3000:]
    for text in expected:
        assert text in console, (text, console[-3000:])
    run = session.work / out_dir
    assert _steps(run) == [1, 2, 3, 4] and (run / "logs" / "worker_1.log").is_file()
    return console


def test_tensor_parallel_demo(session):
    console = _launch(session, "mf launch -n 2 examples/tiny/train.yaml --set parallelism.tensor_parallel=2 "
                               "--set output_dir=output/tiny_tp2", "output/tiny_tp2", "mf launch: 2 ranks", "(TP+SP)",
                      "eval at step 4", "comm ", "  prompt     | A class definition", " per rank (of 2)")
    out = session.work / "output" / "tiny_tp2"
    assert (out / "logs" / "worker_1.log").read_text().count("mf train: done at step 4") == 1
    rows = [r for r in _metrics(out / "metrics.jsonl") if "loss" in r]
    assert all(r["comm_bytes"] > 0 for r in rows)
    files = {p.name for p in (out / "checkpoint" / "iteration_00000004").iterdir()}
    assert "checkpoint-model-0000000-0000002.safetensors" in files and "metadata.json" in files
    # MindSpore's own INFO lines stay in the rank logs, off the console; rank 0 alone writes the run files
    assert not [line for line in console.splitlines() if line.startswith("[INFO] ")], console[-3000:]
    assert (out / "summary.json").is_file() and (out / "train.log").read_text().count("step 4/4") == 1


def test_context_parallel_demo(session):
    _launch(session, "mf launch -n 2 examples/tiny/train.yaml --set parallelism.context_parallel=2 "
                     "--set output_dir=output/tiny_cp2", "output/tiny_cp2", "cp=2", "eval at step 4")


def test_pipeline_parallel_demo(session):
    """The command that crashed (`PipelineStage` has no `args`); every schedule's losses against one
    process are test_pipeline_training.py's."""
    _launch(session, "mf launch -n 2 examples/tiny/train.yaml --set parallelism.pipeline_parallel=2 "
                     "--set output_dir=output/tiny_pp2", "output/tiny_pp2", "pp=2", "eval at step 4")


def test_deepseek_demo(session):
    out = session.run("mf train examples/tiny_deepseek/train.yaml", *STEPS).stdout
    assert "mf train: done at step 4" in out
    rows = [r for r in _metrics(session.work / "output" / "tiny_deepseek" / "metrics.jsonl") if "loss" in r]
    assert len(rows) == 4 and all("moe/aux_loss" in r for r in rows)


def test_expert_parallel_deepseek_demo(session):
    _launch(session, "mf launch -n 2 examples/tiny_deepseek/train.yaml --set parallelism.expert_parallel=2 "
                     "--set output_dir=output/tiny_deepseek_ep2", "output/tiny_deepseek_ep2", "ep=2")


def test_reference_skeleton_validate_dry_run_and_plan(session):
    """`train.yaml`: the reference's skeleton saved under that name, as it says to."""
    session.run("mf config validate train.yaml --world 8")
    out = session.run("mf train train.yaml --dry-run --world 8").stdout
    assert "layout: world=8 " in out and "nothing was written" in out
    session.run("mf plan train.yaml")
    assert not (session.work / "output" / "ckpt").exists()


# examples/README.md, in its table's order

def test_eval_yaml(session):
    """The same checkpoint and split, named explicitly: the same loss as the training YAML's eval."""
    got = session.run("mf eval examples/tiny/eval.yaml").stdout
    assert _eval_loss(got) == _eval_loss(session.ran["mf eval examples/tiny/train.yaml"].stdout), got


def test_predict_yaml(session):
    done = session.run("mf generate examples/tiny/predict.yaml")
    assert done.stdout.startswith("The for statement")          # the prompts in order, each completed
    assert all(prompt in done.stdout for prompt in ("A class definition", "Exceptions"))
    assert "mf generate: 3 prompt(s)" in done.stderr


def test_lora_fine_tune_then_its_eval_and_generate(session):
    out = session.run("mf train examples/tiny/lora.yaml", *STEPS).stdout
    assert "model: taken from output/tiny/checkpoint (hf_config) (llama: num_hidden_layers 4, hidden_size 192" in out
    assert re.search(r"demo SFT data: \d+ conversations from pydoc_data.topics", out) and "LoRA: rank 8" in out
    assert "trainable (" in next(x for x in out.splitlines() if "parameters: " in x)
    assert "mf train: done at step 4" in out
    evals = [r for r in _metrics(session.work / "output" / "tiny_lora" / "metrics.jsonl") if "eval_loss" in r]
    assert [r["step"] for r in evals] == [4]
    # mf eval on the fine-tune YAML: the fine-tuned adapters (merged into their base), not the base
    got = session.run("mf eval examples/tiny/lora.yaml")
    assert "the run's fine-tuned weights: checkpoint.save_path, iteration 4" in got.stderr
    assert _eval_loss(got.stdout) == pytest.approx(evals[-1]["eval_loss"], rel=1e-4), (evals[-1], got.stdout)
    generated = session.run('mf generate examples/tiny/lora.yaml --prompt "..."')
    assert "mf generate: note: weights: output/tiny_lora/checkpoint (the run's fine-tuned weights" in generated.stderr


def test_hf_export_then_full_fine_tune_from_it(session):
    session.run("mf ckpt convert --from mf --to hf output/tiny/checkpoint output/tiny/hf")
    out = session.run("mf train examples/tiny/finetune_hf.yaml", *STEPS).stdout
    assert "model: taken from output/tiny/hf/config.json (llama: num_hidden_layers 4, hidden_size 192" in out
    assert "[mf_trainer] finetune: weights of " in out and "mf train: done at step 4" in out
    assert "hidden_size: 192" in (session.work / "output" / "tiny_ft" / "config.yaml").read_text()


@pytest.mark.parametrize("name", ["qwen3", "deepseek_v3"])
def test_the_other_architectures(session, name):
    out = session.run(f"mf train examples/tiny/{name}.yaml", *STEPS).stdout
    assert "demo corpus: using the cached" in out and "mf train: done at step 4" in out
    losses = [r["loss"] for r in _metrics(session.work / "output" / f"tiny_{name}" / "metrics.jsonl") if "loss" in r]
    assert len(losses) == 4 and all(3.0 < x < 12.0 for x in losses)   # about ln(2000) = 7.6 untrained


# ------------------------------------------------------------------------------------ the harness

def test_every_documented_command_is_run_or_said_why_not(session):
    """Runs last: every command the READMEs hold ran above (as written) or is in NOT_RUN."""
    documented = documented_commands()
    missing = [c for c in documented if c not in session.ran and c not in NOT_RUN]
    stale = [c for c in NOT_RUN if c not in documented]
    assert not missing, f"documented but neither run nor in NOT_RUN: {missing}"
    assert not stale, f"NOT_RUN names commands the READMEs no longer hold: {stale}"
