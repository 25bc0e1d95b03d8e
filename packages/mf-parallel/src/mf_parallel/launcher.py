"""`launch`: run a script on N ranks with msrun, stream rank 0, and end the job when a rank fails.

msrun alone is not enough: when one rank raises, the others block forever in their next
collective and msrun keeps waiting for them. So every rank runs through `_rank_entry.py`, which
writes its pid and, on exit, a .done or .failed file into `<log_dir>/.status/`. The launcher polls
those files and the pids; the first failure (an error, a non-zero exit, or a rank that vanished,
e.g. killed by a signal) ends the whole job at once: msrun's process group and every registered
worker pid are terminated, and one line names the failing rank and its own error:

    mf launch: rank 1 failed (exit 2): mf train: error: checkpoint.load_path: ...

printed once (the streamed rank's own error lines are not echoed to the console beside it). The
log tail follows only when the rank left no error line of its own (a Python exception: its
traceback; a rank that vanished). The return code is the failing rank's exit code (2 for a
refused config, 1 for a failure while training), 1 for an exception or a vanished rank. msrun's
scheduler process runs the same script: when it fails, a rank's report is preferred (it is the
same error, said by the process the user thinks of).

Two more ways a job ends instead of waiting forever:
- a hung rank: every rank that starts a heartbeat (heartbeat.py; the Trainer does) is watched,
  and a live rank silent longer than the timeout it declared ends the job with one line naming
  it and its step (watchdog.py);
- several nodes: the launchers link up (nodelink.py), so a node that dies whole, or whose ranks
  fail or hang, ends the job on every node with the same line, within a second (a closed
  connection) or LINK_TIMEOUT_S (a machine gone silent).

Per-rank logs are msrun's `<log_dir>/worker_<rank>.log` (with several nodes, each node writes
under `<log_dir>/node_<i>/`: node_log_dir); the lowest rank of this node (rank 0 on node 0) is
streamed to `console` as it is written.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from mf_parallel.errors import ParallelConfigError
from mf_parallel.heartbeat import STATUS_ENV
from mf_parallel.nodelink import Hub, LinkEvent, Spoke, link_port
from mf_parallel.watchdog import read_beats, silent_rank

_ENTRY = Path(__file__).with_name("_rank_entry.py")


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999          # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A free port for msrun's scheduler, chosen outside the kernel's ephemeral range when it can
    be: a port the kernel hands out (bind to 0) can be taken as the source port of any outgoing
    connection in the seconds before the scheduler binds it, and a scheduler that cannot bind
    leaves every worker waiting for the cluster time-out."""
    low, high = _ephemeral_range()
    candidates = [p for p in range(20000, 30000) if not low <= p <= high]
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for port in rng.sample(candidates, min(64, len(candidates))):
        if _bindable(port):
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _check_args(nprocs, nodes, node_rank, master_port, argv) -> None:
    for name, value in (("-n/--nproc", nprocs), ("--nodes", nodes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ParallelConfigError(f"launch: {name} must be a positive integer, got {value!r}")
    if isinstance(node_rank, bool) or not isinstance(node_rank, int) or not 0 <= node_rank < nodes:
        raise ParallelConfigError(f"launch: --node-rank must be in 0..{nodes - 1}, got {node_rank!r}")
    if master_port is not None and not (isinstance(master_port, int) and 1024 <= master_port <= 65535):
        raise ParallelConfigError(f"launch: --master-port must be a port number in 1024..65535, got {master_port!r}")
    if not argv:
        raise ParallelConfigError("launch: no script to run")
    if not Path(argv[0]).is_file():
        raise ParallelConfigError(f"launch: script {argv[0]} does not exist")


# A CLI's own error line (mf: "mf train: error: ...", "mf train: training failed: ..."): the
# launcher's failure line reports it, so the console stream does not show it a second time.
_OWN_ERROR = re.compile(r"^\S+( \S+)?: (error|training failed|evaluation failed|failed): ")
_EXITED = re.compile(r"^exited with code (-?\d+): ?(.*)$", re.S)


class _Tail:
    """Follows one log file, handing complete new lines to `out` (minus a CLI's own error lines)."""

    def __init__(self, path: Path, out: TextIO) -> None:
        self.path, self.out, self.pos, self.rest = path, out, 0, ""

    def _emit(self, line: str) -> None:
        if not _OWN_ERROR.match(line):
            self.out.write(line + "\n")

    def pump(self) -> None:
        try:
            with open(self.path, errors="replace") as f:
                f.seek(self.pos)
                chunk = f.read()
                self.pos = f.tell()
        except FileNotFoundError:
            return
        if chunk:
            text = self.rest + chunk
            lines = text.split("\n")
            self.rest = lines.pop()
            for line in lines:
                self._emit(line)
            self.out.flush()

    def flush(self) -> None:
        self.pump()
        if self.rest:
            self._emit(self.rest)
            self.rest = ""
            self.out.flush()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"   # a zombie has finished
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False


def _tail_of(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log written)"


def _terminate(proc: subprocess.Popen, worker_pids: list[int], grace: float = 3.0) -> None:
    """End msrun's process group and every worker pid we registered (they may have left the group)."""
    targets = [p for p in worker_pids if _alive(p)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        for pid in targets:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if proc.poll() is not None and not any(_alive(p) for p in targets):
                return
            time.sleep(0.05)
    proc.wait()


def node_log_dir(log_dir: str | os.PathLike, nodes: int = 1, node_rank: int = 0) -> Path:
    """Where this node's logs go: `log_dir` itself on one node; `log_dir/node_<i>` with several,
    so nodes sharing one output directory never write the same file (msrun.log, scheduler.log and
    the status files are per node; worker_<rank>.log names are global ranks)."""
    return Path(log_dir) / f"node_{node_rank}" if nodes > 1 else Path(log_dir)


def launch(nprocs: int, argv: Sequence[str], log_dir: str | os.PathLike, *, nodes: int = 1, node_rank: int = 0,
           master_addr: str = "127.0.0.1", master_port: int | None = None, python: str | None = None,
           env: Mapping[str, str] | None = None, console: TextIO | None = None, cwd: str | os.PathLike | None = None,
           cluster_timeout: int = 600, poll_interval: float = 0.2,
           failure_note: Callable[[], str] | None = None) -> int:
    """Run `python argv[0] argv[1:]` on `nprocs` ranks of this node (x `nodes` nodes) under msrun.

    `python` (default: this interpreter) is put first on PATH, because msrun starts `python`
    from PATH. Returns 0 when every rank of this node finished (on node 0 of several: of every
    node), else non-zero (the failing rank's exit code when it reported one). Per-rank logs land
    in `node_log_dir(log_dir, nodes, node_rank)`; ranks run in `cwd` (default: the current
    directory, so relative paths in a config mean what they mean to the caller). With several
    nodes the launchers link up over `master_port + 1` on node 0 (nodelink.py). `failure_note()`
    is appended to the line of a failure that is not bad input (mf launch: the last committed
    checkpoint, which a rerun resumes from).
    """
    _check_args(nprocs, nodes, node_rank, master_port, list(argv))
    console = console or sys.stdout
    python = python or sys.executable
    bin_dir = str(Path(python).parent)
    run_env = dict(os.environ if env is None else env)
    run_env["PATH"] = os.pathsep.join([bin_dir, run_env.get("PATH", "")])
    run_env.setdefault("GLOG_v", "3")
    msrun = shutil.which("msrun", path=run_env["PATH"])
    if msrun is None:
        raise ParallelConfigError(f"launch: msrun not found next to {python} or on PATH (is MindSpore installed?)")
    if master_port is None:
        if nodes > 1:
            raise ParallelConfigError("launch: --master-port is required with more than one node")
        master_port = free_port()
    link = _open_link(nodes, node_rank, nprocs, master_addr, master_port, cluster_timeout)
    logs = node_log_dir(log_dir, nodes, node_rank)
    status = logs / ".status"
    status.mkdir(parents=True, exist_ok=True)
    for stale in status.iterdir():     # leftovers of an earlier run in the same directory
        stale.unlink()
    # An earlier run's rank logs too: the console follows worker_<rank>.log from its start, and
    # would otherwise replay the old run's lines before msrun replaces the file.
    for stale in logs.glob("worker_*.log"):
        stale.unlink()
    run_env[STATUS_ENV] = str(status.resolve())
    world = nprocs * nodes
    cmd = [msrun, f"--worker_num={world}", f"--local_worker_num={nprocs}", f"--master_addr={master_addr}",
           f"--master_port={master_port}", f"--node_rank={node_rank}", f"--log_dir={logs.resolve()}", "--join=True",
           f"--cluster_time_out={cluster_timeout}", str(_ENTRY), str(Path(argv[0]).resolve()), *[str(a) for a in argv[1:]]]
    first_rank = node_rank * nprocs
    try:
        with open(logs / "msrun.log", "w") as msrun_log:
            proc = subprocess.Popen(cmd, env=run_env, cwd=cwd, stdout=msrun_log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        job = _Job(proc, nprocs, node_rank, logs, console, _Tail(logs / f"worker_{first_rank}.log", console), link,
                   failure_note, poll_interval)
        try:
            return job.run()
        except KeyboardInterrupt:
            _terminate(proc, list(job.pids.values()))
            job.tell_link(f"interrupted on node {node_rank}", 130)
            console.write("\nmf launch: interrupted; stopped all ranks\n")
            return 130
    finally:
        if link is not None:
            link.close()


def _open_link(nodes: int, node_rank: int, nprocs: int, master_addr: str, master_port: int,
               timeout: float) -> Hub | Spoke | None:
    if nodes == 1:
        return None
    ranks = list(range(node_rank * nprocs, (node_rank + 1) * nprocs))
    port = link_port(master_port)
    if node_rank > 0:
        return Spoke(master_addr, port, node_rank, ranks, timeout)
    if port > 65535:
        raise ParallelConfigError(f"launch: --master-port {master_port}: the launchers' link needs the next port "
                                  f"too; choose one below 65535")
    try:
        return Hub(port, nodes, ranks, timeout)
    except OSError as exc:
        raise ParallelConfigError(f"launch: --master-port {master_port}: node 0 also needs port {port} for the "
                                  f"launchers' link, and it is not free here ({exc.strerror or exc}); choose "
                                  "another --master-port") from None


class _Job:
    """One node's share of a running job: its ranks, its console, its link to the other nodes."""

    def __init__(self, proc: subprocess.Popen, nprocs: int, node_rank: int, logs: Path, console: TextIO,
                 tail: _Tail, link: Hub | Spoke | None, note: Callable[[], str] | None, poll_interval: float) -> None:
        self.proc, self.nprocs, self.node_rank, self.logs, self.console = proc, nprocs, node_rank, logs, console
        self.status = logs / ".status"
        self.tail, self.link, self.note, self.poll_interval = tail, link, note, poll_interval
        self.pids: dict[str, int] = {}

    def run(self) -> int:
        while True:
            self.tail.pump()
            failure = _find_failure(self.status, self.pids, self.logs / "msrun.log")
            if failure is not None:
                return self._local_failure(*failure)
            hang = silent_rank(self.status, _alive)
            if hang is not None:
                return self._end(hang, 1)
            for event in self._link_events():
                code = self._on_event(event)
                if code is not None:
                    return code
            rc = self.proc.poll()
            if rc is not None:
                self.tail.flush()
                return self._after_local_end(_finish(rc, self.status, self.nprocs, self.logs, self.console))
            time.sleep(self.poll_interval)

    # ---- the other nodes ---------------------------------------------------------------------
    def _link_events(self) -> list[LinkEvent]:
        if self.link is None:
            return []
        if isinstance(self.link, Hub):
            return self.link.poll()
        steps = {rank: beat.step for rank, beat in read_beats(self.status).items()}
        return self.link.poll(steps)

    def _on_event(self, event: LinkEvent) -> int | None:
        """The job's code when `event` ends it, else None."""
        if event.kind == "lost":
            return self._end(event.text, 1)
        if event.kind == "failed":                 # a spoke stopped its own ranks; the hub relays it
            return self._end(f"node {event.node}: {event.text}", event.code)
        if event.kind == "stop":                   # the hub ends the job
            return self._end(event.text, event.code)
        return None

    def tell_link(self, headline: str, code: int) -> None:
        if isinstance(self.link, Hub):
            self.link.tell({"stop": headline, "code": code})
        elif isinstance(self.link, Spoke):
            self.link.report({"failed": headline, "code": code})

    # ---- endings -----------------------------------------------------------------------------
    def _local_failure(self, who: str, message: str) -> int:
        """A rank of this node failed. With other nodes, a moment for the link first: a node that
        vanished makes this node's ranks fail too, and the lost node is the cause to name."""
        if self.link is not None:
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline:
                for event in self._link_events():
                    code = self._on_event(event)
                    if code is not None:
                        return code
                time.sleep(0.1)
        headline, details = _failure_parts(who, message, self.logs)
        return self._end(headline, _exit_code(message), details)

    def _end(self, headline: str, code: int, details: str = "") -> int:
        """Stop this node's ranks, tell the other nodes, print the cause once; returns `code`."""
        _terminate(self.proc, list(self.pids.values()))
        self.tail.flush()
        self.tell_link(headline, code)
        note = self.note() if self.note is not None and code != 2 else ""
        self.console.write(f"\nmf launch: {headline}{'; ' + note if note else ''}\n{details}"
                           f"mf launch: stopped all ranks; logs in {self.logs}\n")
        self.console.flush()
        return code

    def _after_local_end(self, code: int) -> int:
        """msrun exited on this node. Node 0 of several waits for every other node's word."""
        if isinstance(self.link, Spoke):
            self.link.report({"done": True} if code == 0 else
                             {"failed": f"msrun on node {self.node_rank} exited before every rank finished", "code": code})
            return code
        if not isinstance(self.link, Hub):
            return code
        if code != 0:
            self.link.tell({"stop": f"node 0 ended with code {code}", "code": code})
            return code
        self.link.tell({"done": True})
        waited = time.monotonic()
        said = False
        while not self.link.all_finished():
            for event in self.link.poll():
                if event.kind in ("lost", "failed"):
                    text = event.text if event.kind == "lost" else f"node {event.node}: {event.text}"
                    note = self.note() if self.note is not None and event.code != 2 else ""
                    self.console.write(f"\nmf launch: {text}{'; ' + note if note else ''}\n")
                    self.console.flush()
                    return event.code
            if not said and time.monotonic() - waited > 2.0:
                self.console.write("mf launch: node 0 finished; waiting for the other nodes\n")
                self.console.flush()
                said = True
            time.sleep(self.poll_interval)
        return 0


def _finish(rc: int, status: Path, nprocs: int, logs: Path, console: TextIO) -> int:
    """The job's code once msrun has exited: every rank of this node must have reported .done."""
    done = len(list(status.glob("rank_*.done")))
    if done < nprocs:
        # Workers that never started (e.g. python missing) can leave msrun "successful".
        console.write(f"mf launch: msrun exited with code {rc} but only {done} of {nprocs} ranks finished; "
                      f"see {logs}\n{_tail_of(logs / 'msrun.log')}\n")
        return rc or 1
    if rc != 0:
        # Seen on MindSpore 2.10.0: the scheduler process aborts while shutting down after every
        # worker finished ("terminate called without an active exception"); the job did its work.
        console.write(f"mf launch: all {nprocs} ranks finished; msrun itself exited with code {rc} "
                      f"(scheduler: {_tail_of(logs / 'scheduler.log', 1) or 'no log'})\n")
    return 0


def _failure_parts(who: str, message: str, logs: Path) -> tuple[str, str]:
    """(the line naming the failing rank and its own error, the log tail to show under it: only
    when the rank left no error line of its own, an exception's traceback, a vanished process)."""
    what, log = ((f"rank {who}", logs / f"worker_{who}.log") if who != "scheduler" else
                 ("the cluster scheduler", logs / "scheduler.log"))
    exited = _EXITED.match(message.strip())
    if exited and exited.group(2).strip() and exited.group(2).strip() != "no error printed":
        return f"{what} failed (exit {exited.group(1)}): {exited.group(2).strip()}", ""
    first = message.strip().splitlines()[0] if message.strip() else ""
    return f"{what} failed: {first}", f"--- last lines of {log} ---\n{_tail_of(log)}\n"


def _failure_report(who: str, message: str, logs: Path) -> str:
    headline, details = _failure_parts(who, message, logs)
    return f"\nmf launch: {headline}\n{details}mf launch: stopped all ranks; logs in {logs}\n"


def _failed_rank(status: Path) -> tuple[str, str] | None:
    for path in sorted(status.glob("rank_*.failed")):
        return path.name[len("rank_"):-len(".failed")], path.read_text(errors="replace")
    return None


def _find_failure(status: Path, pids: dict[str, int], msrun_log: Path | None = None,
                  rank_grace: float = 3.0) -> tuple[str, str] | None:
    """(rank, message) of the first failed or vanished rank, or ("scheduler", message) when the
    cluster's scheduler reported an error and no rank did within `rank_grace` seconds (it runs the
    same script: a bad input fails there too, and the rank's report is the one to show). Updates
    `pids`. Of several ranks that vanished together, the one msrun saw die first (`msrun_log`) is
    named."""
    failed = _failed_rank(status)
    if failed is not None:
        return failed
    scheduler = status / "scheduler.failed"
    if scheduler.exists():
        deadline = time.monotonic() + rank_grace
        while time.monotonic() < deadline:
            failed = _failed_rank(status)
            if failed is not None:
                return failed
            time.sleep(0.1)
        return "scheduler", scheduler.read_text(errors="replace")
    for path in status.glob("rank_*.pid"):
        rank = path.name[len("rank_"):-len(".pid")]
        if rank not in pids:
            try:
                pids[rank] = int(path.read_text())
            except ValueError:
                continue
    vanished = []
    for rank, pid in pids.items():
        if not _alive(pid) and not (status / f"rank_{rank}.done").exists():
            if (status / f"rank_{rank}.failed").exists():
                return rank, (status / f"rank_{rank}.failed").read_text(errors="replace")
            vanished.append((rank, pid))
    if not vanished:
        return None
    rank, pid = vanished[0]
    verdict = _msrun_verdict(msrun_log, {pid for _, pid in vanished}) if msrun_log is not None else None
    if len(vanished) > 1 and verdict is None and msrun_log is not None:
        # Several ranks gone within one poll: one was killed or crashed, the others died of it (a
        # peer's abort, or msrun's kill). msrun polls its children every second and logs the first
        # one it finds dead; wait for that verdict rather than blame the lowest rank.
        deadline = time.monotonic() + 2.5
        while verdict is None and time.monotonic() < deadline:
            time.sleep(0.1)
            verdict = _msrun_verdict(msrun_log, {pid for _, pid in vanished})
    how = "killed by a signal or crashed in native code"
    if verdict is not None:
        pid, code = verdict
        rank = next(r for r, p in vanished if p == pid)
        if code < 0:
            how = f"killed by {_signal_name(-code)}, signal {-code}"
    return rank, f"process {pid} died without reporting an error ({how})"


_MSRUN_EXIT = re.compile(r"Worker process (\d+) exit with exception\. Error code: (-?\d+)")


def _msrun_verdict(msrun_log: Path, pids: set[int]) -> tuple[int, int] | None:
    """(pid, exit code) of the first of `pids` that msrun reported dead, if it has yet."""
    try:
        text = msrun_log.read_text(errors="replace")
    except OSError:
        return None
    for match in _MSRUN_EXIT.finditer(text):
        if int(match.group(1)) in pids:
            return int(match.group(1)), int(match.group(2))
    return None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "an unknown signal"


def _exit_code(message: str) -> int:
    """The failing rank's own exit code (2 bad input, 1 failure while running); 1 otherwise."""
    exited = _EXITED.match(message.strip())
    if exited:
        code = int(exited.group(1))
        return code if code > 0 else 1
    return 1
