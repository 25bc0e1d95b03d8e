"""What a run directory already holds, and what a run may do with it: resume it, refuse it, or
(`--overwrite`) remove this run's own files from it first.

    state = inspect_run(cfg)        # reads output_dir and checkpoint.save_path, writes nothing
    state.verdict                   # "new", "resume", "explicit", or a refusal (state.problem)

Verdicts, by what `checkpoint.save_path` and `output_dir` hold (run identity: run_identity.py):

  new        nothing of an earlier run: train from the start
  resume     a committed checkpoint of THIS run (same identity) below training.steps: continue
             from it (weights, optimizer, step, data position, RNG), as TorchTitan does
  explicit   checkpoint.load_path names save_path itself: the user asked to resume it (whatever
             config wrote it)
  finished   a committed checkpoint of this run at training.steps or beyond: refused (raise
             training.steps to train further, or --overwrite)
  other_run  a committed checkpoint of another run (another identity, or none recorded): refused,
             for every run_mode (saving beside it would rotate it away through save_max)
  leftovers  no committed checkpoint, but metrics, TensorBoard events or a summary of an earlier
             run (or iteration directories without a commit marker): refused
  overwrite  `--overwrite` was given: the files below are removed before the first write

`--overwrite` removes exactly what a run writes, at the places this config names, and nothing
else (OUTPUT_FILES / checkpoint directories): in output_dir `config.yaml`, `train.log`,
`metrics.jsonl`, `summary.json`, `error.log`, `error_rank<N>.log`, `tensorboard/events.out.tfevents.*`;
in checkpoint.save_path the commit marker `latest_checkpointed_iteration.txt` (first, so a crash
midway leaves nothing that looks committed) and the `iteration_<N>` directories. Never: the
directories themselves, mf launch's `logs/`, a profile, any other file, and never
checkpoint.load_path (an overwrite that would reach it is refused).

Standard library, mf-config and mf-ckpt only (no MindSpore): the preflight asks it.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from mf_trainer import run_identity

MARKER = "latest_checkpointed_iteration.txt"   # mf-ckpt's commit point of a save directory
OUTPUT_FILES = ("config.yaml", "train.log", "metrics.jsonl", "summary.json", "error.log")
_ITERATION = re.compile(r"^iteration_[0-9]{8,18}$")
_ERROR_LOG = "error_rank*.log"
_EVENTS = "events.out.tfevents.*"


@dataclass
class RunDirectory:
    output_dir: str
    save_path: str
    verdict: str = "new"
    key: str = ""                 # the field a refusal names
    problem: str = ""             # the refusal's reason (one line), "" when the run may go ahead
    step: int | None = None       # the committed checkpoint's step
    checkpoint: str | None = None  # its iteration directory
    common: dict = field(default_factory=dict)   # its common.json (the trainer's dict)
    notes: list[str] = field(default_factory=list)
    removals: list[str] = field(default_factory=list)   # what --overwrite removes (existing paths)

    @property
    def resumes_own(self) -> bool:
        """The run continues from its own save_path (automatically)."""
        return self.verdict == "resume"

    def describe(self) -> str:
        """One line for the console and the dry run."""
        if self.verdict == "resume":
            return (f"resuming this run from its checkpoint at step {self.step} ({self.checkpoint}): "
                    f"{self.save_path} holds a committed checkpoint of the same run (--overwrite starts over)")
        if self.verdict == "explicit":
            return f"resuming from checkpoint.load_path {self.save_path} (this run's own save_path)"
        if self.verdict == "overwrite":
            shown = ", ".join(self.removals[:4]) + (f" and {len(self.removals) - 4} more" if len(self.removals) > 4
                                                    else "")
            return (f"--overwrite: removing this run's earlier outputs ({shown}) before the first step"
                    if self.removals else "--overwrite: nothing of an earlier run to remove; a new run")
        return "a new run"


def _records(path: Path) -> int:
    """JSON records in a metrics file (0 when it is missing or empty)."""
    try:
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return 0


def _leftovers(output_dir: Path) -> list[str]:
    """An earlier run's outputs that a new run would mix its own history into."""
    found = []
    if _records(output_dir / "metrics.jsonl"):
        found.append(str(output_dir / "metrics.jsonl"))
    if (output_dir / "summary.json").is_file():
        found.append(str(output_dir / "summary.json"))
    if glob.glob(glob.escape(str(output_dir / "tensorboard")) + "/" + _EVENTS):
        found.append(str(output_dir / "tensorboard"))
    return found


def removal_targets(output_dir: str, save_path: str) -> list[str]:
    """The existing paths `--overwrite` removes, in removal order (see the module docstring)."""
    out, save = Path(output_dir), Path(save_path)
    targets = []
    if (save / MARKER).is_file():
        targets.append(str(save / MARKER))
    if save.is_dir():
        targets += sorted(str(p) for p in save.iterdir() if _ITERATION.match(p.name) and p.is_dir())
    for name in OUTPUT_FILES:
        if (out / name).is_file():
            targets.append(str(out / name))
    targets += sorted(glob.glob(glob.escape(str(out)) + "/" + _ERROR_LOG))
    targets += sorted(glob.glob(glob.escape(str(out / "tensorboard")) + "/" + _EVENTS))
    return targets


def remove_outputs(targets: list[str]) -> None:
    """Remove what `removal_targets` listed (marker first), then an emptied tensorboard/."""
    for target in targets:
        path = Path(target)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    tensorboards = {str(Path(t).parent) for t in targets if Path(t).name.startswith("events.out.tfevents.")}
    for directory in tensorboards:
        try:
            os.rmdir(directory)
        except OSError:
            pass  # not empty: something else lives there, and it stays


def _inside(path: str, targets: list[str]) -> str | None:
    real = os.path.realpath(path)
    for target in targets:
        t = os.path.realpath(target)
        if real == t or real.startswith(t.rstrip(os.sep) + os.sep) or t.startswith(real.rstrip(os.sep) + os.sep):
            return target
    return None


def _read_checkpoint(save_path: str):
    """(step, iteration directory, common) of save_path's committed checkpoint."""
    import mf_ckpt

    result = mf_ckpt.load(save_path, {}, strict=False)
    common = dict(result.common)
    step = common.get("step", result.iteration)
    return (step if isinstance(step, int) and not isinstance(step, bool) else result.iteration), result.source, common


def _describe_run(common: dict) -> str:
    mine = common.get("finetune")
    if isinstance(mine, dict):
        lora = mine.get("lora")
        return f"a fine-tune of {mine.get('base')}" + (" with LoRA" if lora else "")
    train = common.get("train_config")
    if isinstance(train, dict):
        return f"a run_mode {train.get('run_mode', 'train')} run of another config"
    return "a run whose config is not recorded"


def _enclosing_checkpoint(path: str, own_save_path: str) -> str | None:
    """The checkpoint directory (one holding a commit marker) that `path` is, or is inside of,
    other than this run's own save_path; None when there is none."""
    own = os.path.realpath(own_save_path)
    here = Path(os.path.realpath(path))
    for directory in (here, *here.parents):
        if str(directory) != own and (directory / MARKER).is_file():
            return str(directory)
    return None


def inspect_run(cfg, *, overwrite: bool = False) -> RunDirectory:
    """What output_dir / checkpoint.save_path hold for `cfg`, and the verdict (module docstring)."""
    ckpt = cfg.checkpoint
    state = RunDirectory(cfg.output_dir, ckpt.save_path)
    # Never inside another run's checkpoints: that run's rotation (save_max) or --overwrite would
    # delete this run's files with the iteration they sit in.
    for key, path in (("output_dir", cfg.output_dir), ("checkpoint.save_path", ckpt.save_path)):
        enclosing = _enclosing_checkpoint(path, ckpt.save_path)
        if enclosing is not None:
            where = "is" if os.path.realpath(path) == enclosing else "is inside"
            return _refuse(state, "other_run", key,
                           f"{path} {where} {enclosing}, the checkpoint directory of another run (its rotation "
                           f"would delete what this run writes there): choose a directory outside it")
    save = Path(ckpt.save_path)
    explicit = bool(ckpt.load_path) and os.path.realpath(ckpt.load_path) == os.path.realpath(ckpt.save_path)
    if overwrite:
        state.removals = removal_targets(cfg.output_dir, ckpt.save_path)
        hit = _inside(ckpt.load_path, state.removals) if ckpt.load_path else None
        if hit is not None:
            return _refuse(state, "overwrite", "checkpoint.load_path",
                           f"{ckpt.load_path} is among what --overwrite would remove ({hit}); resume without "
                           "--overwrite, or copy the weights elsewhere first")
        state.verdict = "overwrite"
        return state
    stop = "--overwrite to start over (removes only this run's own outputs there), or choose another output_dir"
    if os.path.isfile(save / MARKER):
        import mf_ckpt

        try:
            step, where, common = _read_checkpoint(ckpt.save_path)
        except (mf_ckpt.CheckpointError, OSError, ValueError) as exc:
            line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return _refuse(state, "other_run", "checkpoint.save_path",
                           f"{ckpt.save_path} holds a checkpoint that cannot be read ({line}); {stop}")
        state.step, state.checkpoint, state.common = step, where, common
        if explicit:
            state.verdict = "explicit"
            return state
        theirs = run_identity.recorded_identity(common)
        mine = run_identity.identity(cfg)
        if theirs is None or theirs != mine:
            why = ("its config is not recorded" if theirs is None
                   else "it differs in " + "; ".join(run_identity.differences(mine, theirs)))
            resume = (f"continue it with the config that wrote it ({Path(cfg.output_dir) / 'config.yaml'})"
                      if cfg.run_mode == "finetune" else f"resume it with --set checkpoint.load_path={ckpt.save_path}")
            return _refuse(state, "other_run", "checkpoint.save_path",
                           f"{ckpt.save_path} holds checkpoint {step} of {_describe_run(common)} ({why}): {resume}, "
                           f"or {stop}")
        if step is not None and step >= cfg.training.steps:
            return _refuse(state, "finished", "training.steps",
                           f"{cfg.training.steps}: this run already finished at step {step} ({where}); raise "
                           f"training.steps to train further (--set training.steps=N), or {stop}")
        state.verdict = "resume"
        return state
    if explicit:
        return state      # nothing committed there: the load reports it
    stray = sorted(p.name for p in save.iterdir() if _ITERATION.match(p.name)) if save.is_dir() else []
    if stray:
        return _refuse(state, "leftovers", "checkpoint.save_path",
                       f"{ckpt.save_path} holds {', '.join(stray[:3])} but no {MARKER} (no committed checkpoint to "
                       f"resume; saving there could rotate them away): {stop}")
    # metrics.jsonl, config.yaml and train.log are what rank 0 writes as this run begins: a rank
    # that inspects the directory a moment later would take them for an earlier run's. Only rank 0
    # judges them (it refuses, and the launch fails, before the others could differ).
    leftovers = _leftovers(Path(cfg.output_dir)) if _launch_rank() == 0 else []
    if leftovers:
        names = [Path(p).name for p in leftovers]
        listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        return _refuse(state, "leftovers", "output_dir",
                       f"{cfg.output_dir} holds {listed} of an earlier run but "
                       f"no checkpoint to resume from (a new run would mix its history into them): {stop}")
    return state


def _launch_rank() -> int:
    """This process's rank as msrun (or torchrun-style launchers) set it; 0 outside a launch."""
    for key in ("RANK_ID", "RANK"):
        value = os.environ.get(key, "")
        if value.isdigit():
            return int(value)
    return 0


def _refuse(state: RunDirectory, verdict: str, key: str, problem: str) -> RunDirectory:
    state.verdict, state.key, state.problem = verdict, key, problem
    return state


# ---- writability (the preflight's outputs check) ----------------------------------------------
def writable_problem(path: str) -> str | None:
    """Why a directory the run creates and writes into cannot be, read-only: it exists and is not
    a writable directory, or the nearest existing ancestor is a file or not writable."""
    p = Path(path)
    if p.exists():
        if not p.is_dir():
            return f"{path} is a file, not a directory"
        if not os.access(p, os.W_OK | os.X_OK):
            return f"{path} is not writable"
        return None
    if p.is_symlink():
        return f"{path} is a broken symbolic link"
    ancestor = Path(os.path.abspath(path)).parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{path} cannot be created: {ancestor} is a file"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"{path} cannot be created: {ancestor} is not writable"
    return None


def probe_writable(path: str) -> str | None:
    """Create `path` (a directory) if needed and write, then remove, a probe file in it: what
    permission bits cannot tell (root in /proc, a read-only mount, a full disk). None when it can
    be written, else why not (one line). Each rank's probe has its own name."""
    import socket

    probe = os.path.join(path, f".mf-write-probe.{socket.gethostname()}.{os.getpid()}")
    try:
        os.makedirs(path, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"mf")
        os.unlink(probe)
    except OSError as err:
        return f"{path} cannot be written ({err.strerror or type(err).__name__})"
    return None


def file_in_the_way(output_dir: str, tensorboard: bool) -> list[str]:
    """Names the run writes inside output_dir that exist as something else (a directory where a
    file goes, a file where tensorboard/ goes)."""
    out = Path(output_dir)
    found = [str(out / name) + " is a directory" for name in OUTPUT_FILES if (out / name).is_dir()]
    if tensorboard and (out / "tensorboard").exists() and not (out / "tensorboard").is_dir():
        found.append(f"{out / 'tensorboard'} is a file (TensorBoard writes a directory there)")
    return found


def read_summary(output_dir: str) -> dict | None:
    """The summary.json a finished session left (None when absent or unreadable)."""
    try:
        data = json.loads((Path(output_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
