"""`mf launch -n N [--nodes K --node-rank R --master-addr A --master-port P] CONFIG [--set K=V ...]`:
`mf train` on N ranks of this node (x K nodes) under msrun, through `mf_parallel.launch`.

Before any rank starts, the YAML goes through mf-trainer's preflight for the world about to start
(exit 2, one line per problem, msrun never started): a layout that does not fit the world, an
unknown model key or an unimplemented strategy fails in a blink instead of after N MindSpore
start-ups.
Each rank runs `mf train CONFIG [--set ...] [--overwrite]` (mf_cli/_rank/mf_train_rank.py) and its
output goes to `<output_dir>/logs/worker_<rank>.log`; this node's first rank (rank 0 on node 0) is
streamed to the console, without MindSpore's own INFO/DEBUG log lines (`[INFO] DISTRIBUTED(...)`:
they stay in the rank's log). The run directory rules are `mf train`'s, checked before msrun
starts (another run's checkpoints or metrics in output_dir: refused, unless `--overwrite`). If any
rank fails (an error, a non-zero exit, a rank killed by a signal) or hangs (its heartbeat silent
for training.hang_timeout_s) the launcher stops every rank at once, prints one line naming the
rank and its error, and `mf launch` exits non-zero (the rank's exit code when it reported one: 2
for bad input, 1 for a training failure); unless the input was bad the line ends with the last
committed checkpoint, which a rerun of the same command resumes from.

Multi-node: run the same command on every node with its `--node-rank` and a common
`--master-addr` (node 0's address) / `--master-port` (node 0 also listens on the port after it:
the launchers' link). output_dir and checkpoint.save_path must be storage every node sees; each
node writes its logs under `<output_dir>/logs/node_<i>/`. A node that dies, or whose rank fails or
hangs, ends the job on every node with the same line.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from mf_cli.errors import UsageError

RANK_SCRIPT = Path(__file__).resolve().parent.parent / "_rank" / "mf_train_rank.py"


def add_parser(subparsers, name: str, help_text: str) -> None:
    p = subparsers.add_parser(name, help=help_text, description=help_text)
    p.add_argument("-n", "--nproc", type=int, required=True, metavar="N", help="ranks on this node")
    p.add_argument("--nodes", type=int, default=1, help="nodes in the job (default 1)")
    p.add_argument("--node-rank", type=int, default=0, help="this node's index, 0..nodes-1 (default 0)")
    p.add_argument("--master-addr", default="127.0.0.1", help="address of node 0 (default 127.0.0.1)")
    p.add_argument("--master-port", type=int, help="port on node 0 (default: a free one; required with --nodes > 1)")
    p.add_argument("config", help="training YAML")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key before validation (repeatable), e.g. parallelism.tensor_parallel=2")
    p.add_argument("--overwrite", action="store_true",
                   help="start over: rank 0 first removes what a run writes in output_dir and checkpoint.save_path "
                        "(as mf train --overwrite)")
    p.set_defaults(run=run)


def resume_note(checkpoint, nodes: int = 1) -> str:
    """Where a rerun of the same command resumes: the checkpoint committed in the `checkpoint`
    section's save_path (a save cut short by the failure is never taken for one: the commit
    marker still names the previous)."""
    import mf_ckpt

    save_path = checkpoint.save_path
    if not checkpoint.enable_save:
        return "no checkpoints saved (checkpoint.enable_save: false): a rerun starts over"
    try:
        committed = mf_ckpt.committed_checkpoint(save_path)
    except (mf_ckpt.CheckpointError, OSError) as exc:
        return f"last committed checkpoint: unreadable ({exc})"
    if committed is None:
        return f"no checkpoint committed in {save_path} yet (a rerun starts over)"
    where = " on every node" if nodes > 1 else ""
    return f"last committed checkpoint: {committed} (rerun the same command{where} to resume from it)"


# MindSpore's own C++/Python log lines (glog format): `[INFO] DISTRIBUTED(pid,thread,python):time [file] ...`.
_MINDSPORE_CHATTER = re.compile(r"^\[(DEBUG|INFO)\] [A-Z_]+\(\d+,")


class ConsoleFilter:
    """The console stream of `mf launch`: what the launcher writes, minus MindSpore's INFO / DEBUG
    lines (GLOG_v=3 does not silence all of them: a rank's communication shutdown prints some)."""

    def __init__(self, stream):
        self.stream = stream
        self.rest = ""

    def write(self, text: str) -> int:
        lines = (self.rest + text).split("\n")
        self.rest = lines.pop()
        for line in lines:
            if not _MINDSPORE_CHATTER.match(line):
                self.stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        if self.rest and not _MINDSPORE_CHATTER.match(self.rest):
            self.stream.write(self.rest)
        self.rest = ""
        self.stream.flush()


def run(args) -> int:
    os.environ.setdefault("GLOG_v", "3")
    import mf_parallel

    for flag, value in (("-n/--nproc", args.nproc), ("--nodes", args.nodes)):
        if value < 1:
            raise UsageError(f"{flag}: must be a positive integer, got {value}")
    from mf_cli.checks import check, load_config

    config = load_config(args.config, args.overrides)
    # The whole preflight for the world about to start (the device when the YAML names it; the
    # ranks check it again with the device they resolve): no rank starts for a refused config.
    from mf_cli.checks import completed

    check(completed(config), "launch", args.nproc * args.nodes, config.context.device_target, source=args.config,
          overwrite=args.overwrite)
    log_dir = mf_parallel.node_log_dir(Path(config.output_dir) / "logs", args.nodes, args.node_rank)
    argv = [str(RANK_SCRIPT), args.config]
    for override in args.overrides:
        argv += ["--set", override]
    if args.overwrite:
        argv.append("--overwrite")
    try:
        print(f"mf launch: {args.nproc * args.nodes} ranks ({args.nproc} on this node); "
              f"logs in {log_dir}/worker_<rank>.log; streaming rank {args.node_rank * args.nproc}", flush=True)
        return mf_parallel.launch(args.nproc, argv, Path(config.output_dir) / "logs", nodes=args.nodes,
                                  node_rank=args.node_rank, master_addr=args.master_addr,
                                  master_port=args.master_port, python=sys.executable,
                                  console=ConsoleFilter(sys.stdout),
                                  failure_note=lambda: resume_note(config.checkpoint, args.nodes))
    except mf_parallel.ParallelConfigError as exc:
        raise UsageError(str(exc).removeprefix("launch: ")) from None
