"""Two machines on one: two Linux network namespaces joined by a veth pair, each with its own
address (10.231.0.1 and .2, which exist only inside them), its own loopback and its own ports.
msrun starts the scheduler on the node whose own addresses include --master-addr, and both nodes
on 127.0.0.1 would both claim it; here, as on a real cluster, only node 0 has it.

`TwoHosts.create()` makes them (skipping the calling test with the reason when it cannot: not
Linux, no `ip`, not root, or namespaces not allowed in this container); `remove()` kills every
process left inside and deletes them (the veth pair goes with them). Every node shares this
machine's file system: the shared storage of a cluster.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

ADDRESSES = ("10.231.0.1", "10.231.0.2")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


class TwoHosts:
    def __init__(self, names: tuple[str, str]) -> None:
        self.names = names
        self.addresses = ADDRESSES

    @classmethod
    def create(cls) -> TwoHosts:
        if not sys.platform.startswith("linux"):
            pytest.skip("two hosts on one machine need Linux network namespaces")
        if shutil.which("ip") is None:
            pytest.skip("two hosts on one machine need the `ip` command (iproute2) to make network namespaces")
        if os.geteuid() != 0:
            pytest.skip("making network namespaces needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN); not root here")
        tag = os.getpid()
        hosts = cls((f"mf{tag}n0", f"mf{tag}n1"))
        veth = (f"mfv{tag}a", f"mfv{tag}b")
        steps = [("netns", "add", hosts.names[0]), ("netns", "add", hosts.names[1]),
                 ("link", "add", veth[0], "type", "veth", "peer", "name", veth[1])]
        for i in (0, 1):
            steps += [("link", "set", veth[i], "netns", hosts.names[i]),
                      ("-n", hosts.names[i], "addr", "add", f"{ADDRESSES[i]}/24", "dev", veth[i]),
                      ("-n", hosts.names[i], "link", "set", veth[i], "up"),
                      # a fresh namespace's loopback is down: MindSpore's processes talk over it too
                      ("-n", hosts.names[i], "link", "set", "lo", "up")]
        for step in steps:
            try:
                _ip(*step)
            except subprocess.CalledProcessError as exc:
                hosts.remove()
                _ip("link", "del", veth[0], check=False)
                pytest.skip(f"cannot make a network namespace here (`ip {' '.join(step)}`: "
                            f"{exc.stderr.strip() or exc.returncode})")
        return hosts

    def command(self, node: int, argv: list[str]) -> list[str]:
        """`argv` run inside node `node`'s namespace (same environment, same file system)."""
        return ["ip", "netns", "exec", self.names[node], *argv]

    def pids(self, node: int) -> list[int]:
        out = _ip("netns", "pids", self.names[node], check=False).stdout
        return [int(p) for p in out.split() if p.isdigit()]

    def kill_node(self, node: int) -> int:
        """SIGKILL every process of the node (its launcher, msrun, the ranks): the machine is gone."""
        pids = self.pids(node)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(pids)

    def remove(self) -> None:
        for node in (0, 1):
            for _ in range(3):
                if not self.kill_node(node):
                    break
                time.sleep(0.5)
            _ip("netns", "del", self.names[node], check=False)
