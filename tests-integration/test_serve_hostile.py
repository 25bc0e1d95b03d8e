"""`mf serve` (a real process, PyNative: no compile to wait for) against clients that misbehave:

- clients of non-streaming requests that leave while their tokens are generated: their slots are
  freed at once (the requests are cancelled, far fewer tokens are generated than asked for), and
  the next request is answered;
- strings holding a lone UTF-16 surrogate (valid JSON escapes, no text) in every field that carries
  text: a 400 naming the field, never a 500;
- clients that close their connection in the middle of the request body, on every POST route:
  nothing in the log (no traceback, no line per client), each counted as status 499 in /metrics.

After each table, the server still answers and its log holds no traceback.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

import mf_ckpt
import mf_data
import mf_models

VOCAB = 160


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from pydoc_data.topics import topics

    root = tmp_path_factory.mktemp("hostile")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in list(topics.values())[:20]), encoding="utf-8")
    spm = str(root / "spm.model")
    mf_data.train_sentencepiece([str(corpus)], spm, VOCAB)
    section = mf_models.tiny_model_section("llama", vocab_size=VOCAB, max_position_embeddings=1024, num_hidden_layers=1)
    mf_ckpt.save(str(root / "tiny"), 1, mf_models.model_state(mf_models.build_model(section, seed=3)),
                 common={"step": 1, "hf_config": section})
    log = open(root / "serve.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "mf_cli.main", "serve", str(root / "tiny"), "--tokenizer", spm,
                             "--mode", "pynative", "--port", "0", "--max-slots", "8", "--max-tokens", "1000"],
                            stdout=subprocess.PIPE, stderr=log, text=True,
                            env={**os.environ, "GLOG_v": "3", "NO_PROXY": "127.0.0.1"})
    found: list[str] = []
    reader = threading.Thread(target=lambda: found.extend(line.split()[-1] for line in proc.stdout
                                                          if line.startswith("mf serve: listening on ")), daemon=True)
    reader.start()
    for _ in range(900):
        if found or proc.poll() is not None:
            break
        reader.join(0.2)
    if not found:
        proc.kill()
        proc.wait()
        log.seek(0)
        pytest.fail(f"mf serve did not start: {log.read()[-3000:]}")
    url = found[0]
    host, port = url.removeprefix("http://").split(":")
    yield {"url": url, "address": (host, int(port)), "log": log}
    proc.terminate()
    assert proc.wait(60) == 0
    log.close()


def _log(server) -> str:
    server["log"].flush()
    with open(server["log"].name, encoding="utf-8", errors="replace") as f:
        return f.read()


def _healthy(server) -> dict:
    body = httpx.get(f"{server['url']}/health", timeout=30).json()
    assert body["status"] == "ok"
    return body


def _metric(server, name: str, labels: str = "") -> float:
    text = httpx.get(f"{server['url']}/metrics", timeout=30).text
    match = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def _raw(server, path: str, body: bytes, length: int | None = None) -> socket.socket:
    """A connection that has sent a POST with `body` (Content-Length `length`, default its size)."""
    sock = socket.create_connection(server["address"], timeout=30)
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body) if length is None else length}\r\n\r\n").encode()
    sock.sendall(head + body)
    return sock


def test_non_streaming_clients_that_leave_free_their_slots(server):
    before = _metric(server, "mf_generation_tokens_total")
    body = json.dumps({"prompt": "The for statement", "max_tokens": 1000, "temperature": 0, "ignore_eos": True})
    gone = [_raw(server, "/v1/completions", body.encode()) for _ in range(8)]
    deadline = time.monotonic() + 120
    while _healthy(server)["active"] < 8 and time.monotonic() < deadline:   # all 8 seated and generating
        time.sleep(0.05)
    assert _healthy(server)["active"] == 8
    for sock in gone:
        sock.close()
    deadline = time.monotonic() + 30
    while _healthy(server)["active"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _healthy(server)["active"] == 0
    started = time.monotonic()
    answer = httpx.post(f"{server['url']}/v1/completions", json={"prompt": "x", "max_tokens": 2, "temperature": 0,
                                                                 "ignore_eos": True}, timeout=60)
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 2
    generated = _metric(server, "mf_generation_tokens_total") - before - 2
    assert generated < 8 * 1000 / 2, generated   # cancelled early, not run to their 1000 tokens
    print(f"8 gone clients: {generated:.0f} tokens generated of 8000 asked; next 2-token request "
          f"{time.monotonic() - started:.2f} s")


CHAT = '{"messages": [{"role": "user", "content": %s}]}'
SURROGATES = [  # (route, raw JSON body, param named in the 400)
    ("/v1/completions", b'{"prompt": "a\\ud800b"}', "prompt"),
    ("/v1/completions", b'{"prompt": ["fine", "\\udfff"]}', "prompt"),
    ("/v1/completions", b'{"prompt": "x", "model": "\\ud83d"}', "model"),
    ("/v1/completions", b'{"prompt": "x", "stop": ["\\ud800"]}', "stop"),
    ("/v1/completions", b'{"prompt": "x", "user": "\\udc00"}', "user"),
    ("/v1/completions", b'{"prompt": "x", "\\ud800": 1}', None),
    ("/v1/chat/completions", (CHAT % '"\\ud800"').encode(), "messages"),
    ("/v1/chat/completions", (CHAT % '[{"type": "text", "text": "\\ud800"}]').encode(), "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "\\ud800", "content": "x"}]}', "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "model": "\\ud800"}', "model"),
    ("/tokenize", b'{"prompt": "\\ud800"}', "prompt"),
    ("/tokenize", b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "messages"),
    ("/detokenize", b'{"tokens": [5], "model": "\\ud800"}', "model"),
]


@pytest.mark.parametrize("route, body, param", SURROGATES, ids=[f"{r}:{p}:{i}" for i, (r, _, p) in enumerate(SURROGATES)])
def test_lone_surrogates_are_a_400_naming_the_field(server, route, body, param):
    response = httpx.post(f"{server['url']}{route}", content=body, headers={"content-type": "application/json"},
                          timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and "lone UTF-16 surrogate" in error["message"]
    assert "Traceback" not in _log(server)


DROPS = [("/v1/completions", b'{"prompt": "The for statement", "max'),
         ("/v1/chat/completions", b'{"messages": [{"role": "us'),
         ("/tokenize", b'{"prompt": "The')]


@pytest.mark.parametrize("route, partial", DROPS, ids=[r for r, _ in DROPS])
def test_clients_dropping_mid_body_are_quiet(server, route, partial):
    lines_before = len(_log(server).splitlines())
    counted = _metric(server, "mf_http_requests_total", f'{{route="{route}",status="499"}}')

    def drop(_: int) -> None:
        sock = _raw(server, route, partial, length=len(partial) + 500)   # 500 bytes never come
        time.sleep(0.01)
        sock.close()

    with ThreadPoolExecutor(20) as pool:
        list(pool.map(drop, range(100)))
    deadline = time.monotonic() + 60
    while _metric(server, "mf_http_requests_total", f'{{route="{route}",status="499"}}') < counted + 100 \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _metric(server, "mf_http_requests_total", f'{{route="{route}",status="499"}}') == counted + 100
    _healthy(server)
    log = _log(server)
    assert "Traceback" not in log and "Exception in ASGI" not in log, log[-3000:]
    assert len(log.splitlines()) - lines_before <= 1, log.splitlines()[lines_before:][:5]
