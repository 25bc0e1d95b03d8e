"""The launchers' link: how the nodes of one job learn that another node failed, hung or vanished.

Each node's launcher watches only its own ranks (their status files and heartbeats are local). A
node that dies whole (power, kernel panic, every process SIGKILLed) leaves nobody on it to report,
and the other nodes' ranks would wait in their next collective until the backend's own time-out
(about 30 s on MindSpore's CPU backend, HCCL_EXEC_TIMEOUT on Ascend) and then fail with an error
that names no cause. So node 0's launcher listens on `master_port + 1` (the hub) and every other
node's launcher connects to it (a spoke); over the connection, newline-separated JSON:

    spoke -> hub   {"hello": node, "ranks": [...]}  once;  {"beat": {rank: step}} every second
                   {"failed": line, "code": n}  its ranks failed or hung (it stops them itself)
                   {"done": true}  its ranks all finished
    hub -> spoke   {"welcome": [...ranks of node 0]};  {"beat": {}} every second
                   {"stop": line, "code": n}  the job ends: stop your ranks too;  {"done": true}

A closed connection (the kernel closes a dead process's sockets at once) or LINK_TIMEOUT_S without
a message (a machine gone without closing anything) is a lost node, reported with its ranks and
the last step they reached. The hub relays a failure to every other spoke, so every node ends
with the same one-line cause. Plain sockets and select: no thread, no MindSpore.
"""

from __future__ import annotations

import json
import select
import socket
import time
from dataclasses import dataclass

LINK_BEAT_S = 1.0
LINK_TIMEOUT_S = 30.0      # no message for this long: the peer's machine is gone
_MAX_LINE = 1 << 20


def link_port(master_port: int) -> int:
    """The hub's port: the one after msrun's scheduler port."""
    return master_port + 1


def ranks_text(ranks: list[int]) -> str:
    ranks = sorted(ranks)
    if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


@dataclass(frozen=True)
class LinkEvent:
    """`lost` (node gone: text says how), `failed` (a spoke's ranks failed: text is its line),
    `stop` (the hub ends the job: text is the hub's line), `done` (a spoke finished)."""

    kind: str
    node: int
    text: str = ""
    code: int = 1


class _Peer:
    """One connection: JSON lines in and out, and when the last message arrived."""

    def __init__(self, sock: socket.socket) -> None:
        sock.settimeout(2.0)          # sends are small; a peer that cannot take 2 s of them is gone
        self.sock, self.buf, self.last = sock, b"", time.monotonic()
        self.closed = False

    def send(self, message: dict) -> bool:
        if self.closed:
            return False
        try:
            self.sock.sendall(json.dumps(message).encode() + b"\n")
            return True
        except OSError:
            self.close()
            return False

    def receive(self) -> list[dict] | None:
        """Messages that arrived (without waiting); None once the peer closed the connection."""
        messages = []
        while not self.closed:
            try:
                ready, _, _ = select.select([self.sock], [], [], 0)
            except (OSError, ValueError):
                self.close()
                break
            if not ready:
                break
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                self.close()
                break
            self.last = time.monotonic()
            self.buf += chunk
            *lines, self.buf = self.buf.split(b"\n")
            if len(self.buf) > _MAX_LINE:
                self.close()
                break
            for line in lines:
                try:
                    value = json.loads(line)
                except ValueError:
                    continue
                if isinstance(value, dict):
                    messages.append(value)
        return None if self.closed and not messages else messages

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.sock.close()
            except OSError:
                pass


class Hub:
    """Node 0's end: waits for `nodes - 1` spokes, hears their beats, reports the ones lost."""

    def __init__(self, port: int, nodes: int, ranks: list[int], join_timeout: float) -> None:
        self.nodes, self.ranks, self.join_timeout = nodes, ranks, join_timeout
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("", port))          # raises OSError when the port is taken
        self.server.listen(nodes)
        self.server.setblocking(False)
        self.started = time.monotonic()
        self.waiting: list[_Peer] = []                  # connected, no hello yet
        self.peers: dict[int, _Peer] = {}
        self.node_ranks: dict[int, list[int]] = {}
        self.steps: dict[int, int] = {}                 # the furthest step each node's ranks reported
        self.finished: set[int] = set()                 # done, failed or lost: nothing more to hear
        self.last_beat = 0.0

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.server.accept()
            except (BlockingIOError, OSError):
                return
            self.waiting.append(_Peer(sock))

    def _greet(self, events: list[LinkEvent]) -> None:
        for peer in list(self.waiting):
            messages = peer.receive()
            if messages is None:
                self.waiting.remove(peer)
                continue
            hello = next((m for m in messages if isinstance(m.get("hello"), int)), None)
            if hello is None:
                continue
            self.waiting.remove(peer)
            node = hello["hello"]
            if not 0 < node < self.nodes or node in self.peers:
                peer.send({"stop": f"node rank {node} is not expected here (nodes {self.nodes}, or a duplicate "
                                   "--node-rank)", "code": 2})
                peer.close()
                continue
            self.peers[node] = peer
            self.node_ranks[node] = [int(r) for r in hello.get("ranks", [])]
            peer.send({"welcome": self.ranks})
            events.extend(self._handle(node, [m for m in messages if m is not hello]))

    def _handle(self, node: int, messages: list[dict]) -> list[LinkEvent]:
        events = []
        for message in messages:
            if isinstance(message.get("beat"), dict):
                steps = [v for v in message["beat"].values() if isinstance(v, int)]
                if steps:
                    self.steps[node] = max(steps)
            elif "failed" in message:
                self.finished.add(node)
                events.append(LinkEvent("failed", node, str(message["failed"]), _code(message.get("code"))))
            elif message.get("done"):
                self.finished.add(node)
                events.append(LinkEvent("done", node))
        return events

    def _lost(self, node: int, how: str) -> LinkEvent:
        self.finished.add(node)
        ranks = self.node_ranks.get(node)
        who = f"node {node}" + (f" ({ranks_text(ranks)})" if ranks else "")
        step = self.steps.get(node)
        return LinkEvent("lost", node, f"{who} lost{f' at step {step}' if step is not None else ''}: {how}")

    def poll(self) -> list[LinkEvent]:
        events: list[LinkEvent] = []
        self._accept()
        self._greet(events)
        now = time.monotonic()
        for node, peer in self.peers.items():
            if node in self.finished:
                continue
            messages = peer.receive()
            if messages:
                events.extend(self._handle(node, messages))
            if node in self.finished:
                continue
            if messages is None:
                events.append(self._lost(node, "the connection to its launcher closed (its machine or its "
                                               "processes died)"))
            elif now - peer.last > LINK_TIMEOUT_S:
                events.append(self._lost(node, f"no word from its launcher for {now - peer.last:.0f} s "
                                               "(machine down or network cut)"))
        if now - self.started > self.join_timeout:
            for node in range(1, self.nodes):
                if node not in self.peers and node not in self.finished:
                    events.append(self._lost(node, f"its launcher did not connect within {self.join_timeout:.0f} s "
                                                   "(is `mf launch --node-rank "
                                                   f"{node}` running there, with this --master-addr/--master-port?)"))
        if now - self.last_beat >= LINK_BEAT_S:
            self.last_beat = now
            for node, peer in self.peers.items():
                if node not in self.finished:
                    peer.send({"beat": {}})
        return events

    def all_finished(self) -> bool:
        return len(self.finished) >= self.nodes - 1

    def tell(self, message: dict) -> None:
        """To every spoke still running (`stop` when the job ends, `done` when node 0 finished)."""
        for node, peer in self.peers.items():
            if node not in self.finished:
                peer.send(message)

    def close(self) -> None:
        for peer in [*self.peers.values(), *self.waiting]:
            peer.close()
        self.server.close()


class Spoke:
    """A node > 0's end: connects to the hub (retrying until `join_timeout`), beats, reports."""

    def __init__(self, host: str, port: int, node: int, ranks: list[int], join_timeout: float) -> None:
        self.host, self.port, self.node, self.ranks, self.join_timeout = host, port, node, ranks, join_timeout
        self.started = time.monotonic()
        self.peer: _Peer | None = None
        self.hub_ranks: list[int] = []
        self.hub_done = self.gone = False
        self.last_beat = 0.0
        self.last_try = 0.0

    def _connect(self) -> list[LinkEvent]:
        now = time.monotonic()
        if now - self.started > self.join_timeout:
            self.gone = True
            return [LinkEvent("lost", 0, f"node 0 lost: its launcher at {self.host}:{self.port} did not answer within "
                                         f"{self.join_timeout:.0f} s (is `mf launch --node-rank 0` running there?)")]
        if now - self.last_try < 0.5:
            return []
        self.last_try = now
        try:
            sock = socket.create_connection((self.host, self.port), timeout=0.5)
        except OSError:
            return []
        self.peer = _Peer(sock)
        self.peer.send({"hello": self.node, "ranks": self.ranks})
        return []

    def poll(self, steps: dict[str, int]) -> list[LinkEvent]:
        if self.gone:
            return []
        if self.peer is None:
            return self._connect()
        events = []
        messages = self.peer.receive()
        for message in messages or []:
            if isinstance(message.get("welcome"), list):
                self.hub_ranks = [int(r) for r in message["welcome"]]
            elif "stop" in message:
                self.gone = True
                events.append(LinkEvent("stop", 0, str(message["stop"]), _code(message.get("code"))))
            elif message.get("done"):
                self.hub_done = True
        if events:
            return events
        now = time.monotonic()
        if messages is None or now - self.peer.last > LINK_TIMEOUT_S:
            self.gone = True
            if self.hub_done and messages is None:
                return []                  # node 0 finished and left: not a loss
            who = "node 0" + (f" ({ranks_text(self.hub_ranks)})" if self.hub_ranks else "")
            how = ("the connection to its launcher closed (its machine or its processes died)" if messages is None
                   else f"no word from its launcher for {now - self.peer.last:.0f} s (machine down or network cut)")
            return [LinkEvent("lost", 0, f"{who} lost: {how}")]
        if now - self.last_beat >= LINK_BEAT_S:
            self.last_beat = now
            self.peer.send({"beat": steps})
        return []

    def report(self, message: dict) -> None:
        """`{"failed": line, "code": n}` or `{"done": True}` to the hub (when connected)."""
        if self.peer is not None and not self.gone:
            self.peer.send(message)

    def close(self) -> None:
        if self.peer is not None:
            self.peer.close()


def _code(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1
