"""The launcher's pieces without msrun: argument checks, the per-rank entry's reports, failure
detection from the status files, log streaming and the final exit code."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mf_parallel import ParallelConfigError, launch
from mf_parallel.launcher import _ENTRY, _exit_code, _failure_report, _find_failure, _finish, _Tail


@pytest.mark.parametrize("kwargs, message", [
    (dict(nprocs=0), "-n/--nproc must be a positive integer, got 0"),
    (dict(nodes=2, node_rank=2, master_port=9000), r"--node-rank must be in 0..1, got 2"),
    (dict(master_port=80), "--master-port must be a port number in 1024..65535, got 80"),
    (dict(nodes=2, node_rank=1), "--master-port is required with more than one node"),
    (dict(argv=["/no/such/script.py"]), "script /no/such/script.py does not exist"),
    (dict(argv=[]), "no script to run"),
])
def test_bad_arguments_are_one_line(tmp_path, kwargs, message):
    script = tmp_path / "ok.py"
    script.write_text("print('hi')\n")
    args = dict(nprocs=2, argv=[str(script)], log_dir=tmp_path / "logs")
    args.update(kwargs)
    with pytest.raises(ParallelConfigError, match=message):
        launch(args.pop("nprocs"), args.pop("argv"), args.pop("log_dir"), **args)


def _run_entry(tmp_path: Path, body: str, rank: str = "3", **env_extra) -> tuple[subprocess.CompletedProcess, Path]:
    script = tmp_path / "job.py"
    script.write_text(body)
    status = tmp_path / "status"
    status.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "MS_ROLE"}
    env.update({"MF_LAUNCH_STATUS_DIR": str(status), "RANK_ID": rank, **env_extra})
    proc = subprocess.run([sys.executable, str(_ENTRY), str(script), "a1"], env=env, capture_output=True, text=True,
                          timeout=60)
    return proc, status


def test_entry_reports_success(tmp_path):
    proc, status = _run_entry(tmp_path, "import sys, os\nprint(sys.argv[1:], os.path.basename(sys.path[0]))\n")
    assert proc.returncode == 0
    assert "['a1'] " + tmp_path.name in proc.stdout      # argv and sys.path as `python job.py a1` would see
    assert (status / "rank_3.done").exists() and int((status / "rank_3.pid").read_text()) > 0
    assert not (status / "rank_3.failed").exists()


def test_entry_reports_an_exception(tmp_path):
    proc, status = _run_entry(tmp_path, "raise ValueError('bad shard at step 3')\n", rank="1")
    assert proc.returncode == 1
    assert "ValueError: bad shard at step 3" in proc.stderr
    assert (status / "rank_1.failed").read_text().startswith("ValueError: bad shard at step 3")
    assert not (status / "rank_1.done").exists()


def test_entry_reports_sys_exit_0_as_success(tmp_path):
    # A CLI's main() ends with sys.exit(code): code 0 is a normal end, not a rank that vanished.
    proc, status = _run_entry(tmp_path, "import sys\nsys.exit(0)\n")
    assert proc.returncode == 0
    assert (status / "rank_3.done").exists() and not (status / "rank_3.failed").exists()


def test_entry_reports_a_nonzero_exit(tmp_path):
    proc, status = _run_entry(tmp_path, "import sys\nsys.exit(3)\n")
    assert proc.returncode == 3
    message = (status / "rank_3.failed").read_text()
    assert message.startswith("exited with code 3") and _exit_code(message) == 3


def test_entry_reports_the_error_a_cli_printed_before_exiting(tmp_path):
    # `mf train` prints its own error line(s) and exits 2: that is the rank's error, not "2".
    body = ("import sys\nprint('[mf_trainer] progress', file=sys.stderr)\n"
            "print('mf train: error: model.hidden_sizee: unknown key', file=sys.stderr)\nsys.exit(2)\n")
    proc, status = _run_entry(tmp_path, body, rank="1")
    assert proc.returncode == 2 and "mf train: error: model.hidden_sizee" in proc.stderr   # still on stderr
    message = (status / "rank_1.failed").read_text()
    assert message == "exited with code 2: mf train: error: model.hidden_sizee: unknown key\n"
    assert _exit_code(message) == 2
    report = _failure_report("1", message, tmp_path / "logs")
    # one line naming the rank and its error, then where the logs are; no log tail repeating it
    assert report.strip().splitlines() == ["mf launch: rank 1 failed (exit 2): mf train: error: model.hidden_sizee: "
                                           "unknown key", f"mf launch: stopped all ranks; logs in {tmp_path / 'logs'}"]


def test_a_rank_is_named_rather_than_the_scheduler_running_the_same_script(tmp_path):
    status = tmp_path / "status"
    status.mkdir()
    (status / "scheduler.failed").write_text("exited with code 2: mf train: error: parallelism: bad\n")
    (status / "rank_0.failed").write_text("exited with code 2: mf train: error: parallelism: bad\n")
    assert _find_failure(status, {}) == ("0", "exited with code 2: mf train: error: parallelism: bad\n")


def test_entry_reports_the_scheduler_apart_from_rank_0(tmp_path):
    # msrun runs the cluster's scheduler with the workers' command and RANK_ID=0.
    proc, status = _run_entry(tmp_path, "raise RuntimeError('port 1234 in use')\n", rank="0", MS_ROLE="MS_SCHED")
    assert proc.returncode == 1
    assert sorted(p.name for p in status.iterdir()) == ["scheduler.failed", "scheduler.pid"]
    assert _find_failure(status, {}) == ("scheduler", (status / "scheduler.failed").read_text())


def test_of_ranks_gone_together_the_one_msrun_saw_die_first_is_named(tmp_path):
    # Rank 1 was SIGKILLed; rank 0 died of it (msrun's kill, or a collective's abort) before the
    # launcher's next poll. msrun logs the first worker it found dead.
    status = tmp_path / "status"
    status.mkdir()
    dead = [subprocess.Popen([sys.executable, "-c", "pass"]) for _ in range(2)]
    for rank, proc in enumerate(dead):
        proc.wait()
        (status / f"rank_{rank}.pid").write_text(str(proc.pid))
    msrun_log = tmp_path / "msrun.log"
    msrun_log.write_text(f"[ERROR] ME(1:2,MainProcess): [_api.py:365] Worker process {dead[1].pid} exit with "
                         "exception. Error code: -9.\n")
    assert _find_failure(status, {}, msrun_log) == (
        "1", f"process {dead[1].pid} died without reporting an error (killed by SIGKILL, signal 9)")


def test_free_port_avoids_the_ephemeral_range():
    import socket

    from mf_parallel.launcher import _ephemeral_range, free_port

    low, high = _ephemeral_range()
    port = free_port()
    assert not low <= port <= high
    with socket.socket() as s:
        s.bind(("0.0.0.0", port))


def test_failure_detection(tmp_path):
    status = tmp_path / "status"
    status.mkdir()
    pids: dict[str, int] = {}
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (status / "rank_0.pid").write_text(str(live.pid))
        assert _find_failure(status, pids) is None
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        (status / "rank_1.pid").write_text(str(dead.pid))
        rank, message = _find_failure(status, pids)
        assert rank == "1" and "died without reporting an error" in message
        (status / "rank_1.done").write_text("ok\n")                      # a finished rank is not a failure
        assert _find_failure(status, pids) is None
        (status / "rank_0.failed").write_text("RuntimeError: boom\n\ntraceback")
        assert _find_failure(status, pids) == ("0", "RuntimeError: boom\n\ntraceback")
    finally:
        live.kill()
        live.wait()


def test_tail_leaves_a_cli_error_line_to_the_failure_report(tmp_path):
    log = tmp_path / "worker_0.log"
    out = io.StringIO()
    log.write_text("step 1\nmf train: error: checkpoint.load_path: gone\nmf train: training failed: boom\nstep 2\n")
    _Tail(log, out).flush()
    assert out.getvalue() == "step 1\nstep 2\n"


def test_tail_streams_whole_lines(tmp_path):
    log = tmp_path / "worker_0.log"
    out = io.StringIO()
    tail = _Tail(log, out)
    tail.pump()                                   # no file yet
    log.write_text("step 1\nstep 2\npart")
    tail.pump()
    assert out.getvalue() == "step 1\nstep 2\n"
    with open(log, "a") as f:
        f.write("ial line\n")
    tail.pump()
    tail.flush()
    assert out.getvalue() == "step 1\nstep 2\npartial line\n"


def test_finish_codes(tmp_path):
    status = tmp_path / ".status"
    status.mkdir()
    out = io.StringIO()
    (status / "rank_0.done").write_text("ok")
    assert _finish(0, status, 2, tmp_path, out) == 1 and "only 1 of 2 ranks finished" in out.getvalue()
    (status / "rank_1.done").write_text("ok")
    assert _finish(0, status, 2, tmp_path, out) == 0
    assert _finish(1, status, 2, tmp_path, out) == 0 and "all 2 ranks finished; msrun itself exited with code 1" \
        in out.getvalue()


def test_several_nodes_log_apart(tmp_path):
    from mf_parallel import node_log_dir

    assert node_log_dir(tmp_path / "logs") == tmp_path / "logs"
    assert node_log_dir(tmp_path / "logs", 2, 1) == tmp_path / "logs" / "node_1"
