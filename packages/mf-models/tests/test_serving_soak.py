"""Soak: a real server process on 127.0.0.1 takes a few hundred mixed good and bad requests from
16 concurrent clients; afterwards it still answers exactly as before (greedy tokens of a fixed
prompt, which equal the engine's reference) and its resident memory has grown by less than
RSS_BOUND. And an engine that cannot recover makes the process exit non-zero by itself.

Bound: the first requests compile nothing (PyNative) but do allocate the allocator's pools; RSS
is sampled after a warm-up round of the same mix, so what is left is growth per request (a leak
of 100 kB per request would show as 30 MB here). The server's RSS, read from /proc, is about
600 MB at the start (MindSpore itself).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

RSS_BOUND_MB = 64
HERE = Path(__file__).resolve().parent


def start(*args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, str(HERE / "soak_server.py"), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "GLOG_v": "3"})
    found: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            if line.startswith("listening on ") and not found:
                found.append(line.split()[-1])
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    ready.wait(180)
    if not found:
        proc.kill()
        raise AssertionError(f"server did not start: {proc.stderr.read()[-2000:]}")
    return proc, found[0]


def post(url: str, path: str, body: bytes | dict, timeout: float = 60) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
            status = response.status
    except urllib.error.HTTPError as err:
        raw, status = err.read(), err.code
    if raw.startswith(b"data: "):  # a stream: the events, parsed
        events = [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: {")]
        return status, {"events": events}
    return status, json.loads(raw)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


REFERENCE = {"prompt": [44, 45, 46], "max_tokens": 4, "temperature": 0, "ignore_eos": True}
GOOD = [
    (REFERENCE, 200),
    ({"prompt": [[5, 6], [7]], "max_tokens": 2, "temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 3}, 200),
    ({"prompt": [9, 10, 11], "max_tokens": 3, "n": 2, "temperature": 1.0, "seed": 7}, 200),
    ({"prompt": [12], "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}, 200),
    ({"prompt": [13, 14], "max_tokens": 4, "stop_token_ids": [20, 21], "top_k": -1}, 200),
]
BAD = [
    (b'{"prompt": [5], "top_k": 100000000000000000000}', 400),
    (b'{"prompt": [5], "temperature": NaN}', 400),
    (b'{"prompt": [5], "top_p": NaN}', 400),
    (b'{"prompt": [5], "temperature": Infinity}', 400),
    (b'{"prompt": [99999]}', 400),
    (b'{"prompt": [-1]}', 400),
    (b'{"prompt": [1000000000000000000000000000000]}', 400),
    (b"[" * 5000 + b"]" * 5000, 400),
    (b'{"prompt": ' + b"[" * 500 + b"]" * 500 + b"}", 400),
    (b'{"prompt": [5], "seed": 18446744073709551616}', 400),
    (b'{"prompt": [5], "max_tokens": 9}', 400),
    (b'{"prompt": [5], "n": 1e30}', 400),
    (b'{"prompt": [5], "stop_token_ids": [1e30]}', 400),
    (b'{"prompt": "text needs a tokenizer"}', 400),
    (b'{"prompt": [5], "model": "other"}', 404),
    (b"{not json", 400),
    (b"\xff\xfe garbage", 400),
    (b'{"messages": [{"role": "user", "content": "hi"}]}', 400),
]


def soak_round(url: str, count: int, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    jobs = [rng.choice(GOOD) if rng.random() < 0.3 else rng.choice(BAD) for _ in range(count)]
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda job: post(url, "/v1/completions", job[0]), jobs))
    return [(status, expected) for (status, _), (_, expected) in zip(results, jobs)]


def test_soak_mixed_requests_leave_the_server_answering_and_bounded(tmp_path):
    proc, url = start()
    try:
        status, before = post(url, "/v1/completions", REFERENCE)
        assert status == 200
        warm = soak_round(url, 40, seed=0)
        assert all(got == want for got, want in warm), [g for g in warm if g[0] != g[1]][:5]
        rss_start = rss_mb(proc.pid)
        started = time.perf_counter()
        results = soak_round(url, 300, seed=1)
        elapsed = time.perf_counter() - started
        wrong = [(got, want) for got, want in results if got != want]
        assert not wrong, wrong[:10]
        rss_end = rss_mb(proc.pid)
        status, health = post(url, "/v1/completions", REFERENCE)
        assert status == 200 and health["choices"][0]["token_ids"] == before["choices"][0]["token_ids"]
        with urllib.request.urlopen(url + "/health", timeout=30) as response:
            assert json.loads(response.read())["status"] == "ok"
        assert rss_end - rss_start < RSS_BOUND_MB, (rss_start, rss_end)
        print(f"soak: 300 requests in {elapsed:.1f} s, RSS {rss_start:.0f} -> {rss_end:.0f} MB")
    finally:
        proc.terminate()
        assert proc.wait(60) == 0


def test_an_engine_that_cannot_recover_exits_non_zero():
    proc, url = start("--break-decode-after", "2")  # the warm-up's decode and one request's succeed
    try:
        statuses = []
        for _ in range(6):
            try:
                statuses.append(post(url, "/v1/completions", {"prompt": [5, 6], "max_tokens": 4}, timeout=30)[0])
            except (urllib.error.URLError, ConnectionError):
                break  # the server has gone: what a supervisor sees, and restarts
        assert statuses and statuses[0] in (200, 500) and 500 in statuses and 200 not in statuses[1:]
        assert proc.wait(60) == 1
        err = proc.stderr.read()
        assert "soak server: failed: the engine failed: 3 decode steps failed in a row" in err, err[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
