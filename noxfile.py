"""Test matrix for the mf monorepo.

One session per package, each in a venv holding only that package, the mf packages it declares
and their registry dependencies: a package that secretly imports MindSpore or a sibling fails in
its own session. `integration` and `dist` install everything. Venvs are reused between runs
(uv backend), so a second run costs seconds.

    nox                      # the default selection: the project's whole test suite
    nox -s mf-data           # one package
    nox -s dist              # multi-process tests under msrun
    nox -s bench             # benchmarks (not part of the default suite)
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
PACKAGES_DIR = ROOT / "packages"

nox.options.default_venv_backend = "uv"
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True


def _declared_deps(package: str) -> list[str]:
    with open(PACKAGES_DIR / package / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"].get("dependencies", [])


def _all_packages() -> list[str]:
    return sorted(p.name for p in PACKAGES_DIR.iterdir() if (p / "pyproject.toml").is_file())


def _local_closure(package: str) -> list[str]:
    """The mf packages `package` depends on, transitively, read from the pyproject files."""
    local = set(_all_packages())
    seen: list[str] = []
    stack = [package]
    while stack:
        name = stack.pop()
        for dep in _declared_deps(name):
            dep_name = re.split(r"[<>=!~\[; ]", dep, maxsplit=1)[0].strip()
            if dep_name in local and dep_name not in seen and dep_name != package:
                seen.append(dep_name)
                stack.append(dep_name)
    return seen


def _install_local(session: nox.Session, packages: list[str], with_tests: list[str]) -> None:
    """Editable installs, so a reused venv always runs the current source."""
    args: list[str] = []
    for name in packages:
        extra = "[test]" if name in with_tests else ""
        args += ["-e", f"{PACKAGES_DIR / name}{extra}"]
    session.install(*args)


def _test_workers() -> int:
    """pytest-xdist workers for the one-process sessions: one per core, at most 4 (each worker
    imports MindSpore: ~1 GB). MF_TEST_WORKERS overrides it; 1 runs the tests in one process."""
    if os.environ.get("MF_TEST_WORKERS"):
        return max(1, int(os.environ["MF_TEST_WORKERS"]))
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def _pytest(session: nox.Session, *paths: str, parallel: bool = True, extra: tuple[str, ...] = ()) -> None:
    """pytest over `paths`. `parallel`: test files spread over `_test_workers()` processes
    (`--dist loadfile`: a file's module fixtures are built once, in one worker). The tests are tiny
    models whose time is Python and kernel launches on one core, so two workers on two cores take
    ~0.6 of the time of one; the dist session's ranks already fill the cores and run alone.
    `extra`: pytest options of this session only."""
    workers = _test_workers() if parallel else 1
    spread = ["-n", str(workers), "--dist", "loadfile"] if workers > 1 else []
    session.run(
        "python", "-m", "pytest", *paths, *spread, *extra, *session.posargs,
        env={"GLOG_v": "3", "PYTHONHASHSEED": "0"},
    )


# The test runner's own plugin (spreads a session's test files over the cores; see _pytest).
XDIST = "pytest-xdist>=3.5"

# Fast, dependency-light packages first: a broken schema fails the run in seconds.
PACKAGE_ORDER = [
    "mf-config", "mf-data", "mf-ckpt", "mf-parallel", "mf-models", "mf-trainer", "mf-cli",
]


def _make_package_session(package: str):
    @nox.session(name=package)
    def _session(session: nox.Session) -> None:
        _install_local(session, [*_local_closure(package), package], with_tests=[package])
        session.install(XDIST)
        _pytest(session, str(PACKAGES_DIR / package / "tests"))

    _session.__doc__ = f"Tests of {package} in a venv holding only it and its declared dependencies."
    return _session


for _package in PACKAGE_ORDER:
    globals()[f"session_{_package.replace('-', '_')}"] = _make_package_session(_package)


@nox.session
def integration(session: nox.Session) -> None:
    """Cross-package tests, one process (tests-integration/, without dist/)."""
    _install_local(session, _all_packages(), with_tests=_all_packages())
    session.install(XDIST)
    _pytest(session, str(ROOT / "tests-integration"), "--ignore", str(ROOT / "tests-integration" / "dist"))


@nox.session
def dist(session: nox.Session) -> None:
    """Multi-process tests: real collectives between CPU ranks started by msrun."""
    _install_local(session, _all_packages(), with_tests=_all_packages())
    # msrun starts `python` from PATH: make it this venv's.
    session.env["PATH"] = os.pathsep.join([str(Path(session.bin)), os.environ.get("PATH", "")])
    # --durations: CI prints the 30 slowest cases (and the shared launches they pay for), so the
    # dist session's share of the suite's time budget can be read from any run's log.
    _pytest(session, str(ROOT / "tests-integration" / "dist"), parallel=False, extra=("--durations=30",))


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over every package, the integration tests, benchmarks and this file."""
    session.install("ruff>=0.5")
    session.run("ruff", "check", "packages", "tests-integration", "benchmarks", "noxfile.py", "conftest.py")


REFERENCE_VENV = ROOT / "benchmarks" / ".work" / "torchvenv"


def _reference_venv(session: nox.Session, venv: Path = REFERENCE_VENV,
                    requirements: Path = ROOT / "benchmarks" / "requirements-reference.txt",
                    pins: tuple[str, ...] = (), newest: bool = False) -> Path:
    """A venv of reference libraries (torch CPU, megatron-core, transformers) apart from mf, made with pip.

    pip, not uv: this machine's pip configuration finds the CPU wheel of torch on local disk,
    where uv would fetch a multi-GB CUDA build. Reinstalled when the requirements file (or `pins`,
    requirements added to it) changes; `newest`: `pins` are upgraded on every run, so a venv meant
    to hold the newest release does not keep the one it was made with.
    """
    python = venv / "bin" / "python"
    stamp = venv / ".mf-requirements"
    wanted = requirements.read_text() + "".join(f"{pin}\n" for pin in pins)
    if not python.exists():
        session.run("python3", "-m", "venv", str(venv), external=True)
    if not stamp.exists() or stamp.read_text() != wanted:
        session.run(str(python), "-m", "pip", "install", "--quiet", "-r", str(requirements), *pins, external=True)
        stamp.write_text(wanted)
    elif newest and pins:
        session.run(str(python), "-m", "pip", "install", "--quiet", "--upgrade", "-r", str(requirements), *pins,
                    external=True)
    return python


HF_WORK = ROOT / "tests-integration" / ".work"
# The transformers an HF export must load in, each in its own venv: the oldest supported (4.57.x, the
# last 4.x), 5.23.0 (whose TokenizersBackend converted a bare tokenizer.model differently from
# sentencepiece) and the newest 5.x (upgraded on every run).
HF_TRANSFORMERS = (
    ("4.57", "transformers==4.57.*", False),
    ("5.23.0", "transformers==5.23.0", False),
    ("5-newest", "transformers>=5.23,<6", True),
)


@nox.session
def hf_interop(session: nox.Session) -> None:
    """Exports read by transformers / peft themselves, in venvs of their own (no mf package there),
    one per transformers version of HF_TRANSFORMERS; the tests run against each."""
    _install_local(session, _all_packages(), with_tests=_all_packages())
    requirements = ROOT / "tests-integration" / "hf_interop" / "requirements.txt"
    pythons = [_reference_venv(session, HF_WORK / f"hfvenv-{tag}", requirements, (pin,), newest)
               for tag, pin, newest in HF_TRANSFORMERS]
    session.env["MF_HF_PYTHONS"] = os.pathsep.join(str(p) for p in pythons)
    session.env["PATH"] = os.pathsep.join([str(Path(session.bin)), os.environ.get("PATH", "")])
    _pytest(session, str(ROOT / "tests-integration" / "hf_interop"), parallel=False)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks: each prints `name: ours X, reference Y, ratio Z`. Not in the default suite."""
    _install_local(session, _all_packages(), with_tests=[])
    session.install("-r", str(ROOT / "benchmarks" / "requirements.txt"))
    reference = _reference_venv(session)
    scripts = session.posargs or sorted(str(p) for p in (ROOT / "benchmarks").glob("*_bench.py"))
    for script in scripts:
        session.run("python", script, env={"GLOG_v": "3", "MF_BENCH_TORCH_PYTHON": str(reference)})


nox.options.sessions = ["lint", *PACKAGE_ORDER, "integration", "dist"]
