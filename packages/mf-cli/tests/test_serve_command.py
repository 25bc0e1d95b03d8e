"""`mf serve`, as a real server process on localhost: an HF fixture served to a plain urllib client
(greedy tokens equal transformers'), errors in OpenAI's shape, a clean exit on SIGTERM, and bad
input (exit 2, one line). Text, chat, streaming, concurrent requests and the openai client are in
tests-integration/test_serve.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest


def start_server(log, *args: str, timeout: float = 120.0) -> tuple[subprocess.Popen, str]:
    """`mf serve ... --port 0` in its own process; returns it and its URL once it listens. Its
    stderr goes to the file `log` (a pipe nobody reads could fill up and block it)."""
    proc = subprocess.Popen([sys.executable, "-m", "mf_cli.main", "serve", *args, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=log, text=True, env={**os.environ, "GLOG_v": "3"})
    found: list[str] = []
    ready = threading.Event()

    def read() -> None:  # keeps reading to the end, so stdout never fills up
        for line in proc.stdout:
            if line.startswith("mf serve: listening on ") and not found:
                found.append(line.split()[-1])
                ready.set()
        ready.set()  # the process ended without listening

    threading.Thread(target=read, daemon=True).start()
    ready.wait(timeout)
    if not found:
        proc.kill()
        proc.wait()
        log.seek(0)
        raise AssertionError(f"server did not start: {log.read()[-2000:]}")
    return proc, found[0]


def call(url: str, path: str, body: dict | None = None, method: str | None = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture(scope="module")
def server(hf_fixtures, tmp_path_factory):
    with open(tmp_path_factory.mktemp("log") / "serve.log", "w+") as log:
        proc, url = start_server(log, str(hf_fixtures / "llama"), "--mode", "pynative", "--max-slots", "3",
                                 "--max-len", "64")
        yield proc, url
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_completions_over_http_equal_transformers(server, hf_fixtures):
    _, url = server
    ref = np.load(hf_fixtures / "llama_ref.npz")
    prompt = ref["prompt"][0].tolist()
    new = ref["greedy"].shape[1] - len(prompt)
    assert call(url, "/health") == (200, {"status": "ok", "active": 0, "waiting": 0, "slots": 3})
    status, models = call(url, "/v1/models")
    assert status == 200 and models["data"][0]["id"] == "llama" and models["data"][0]["max_model_len"] == 64
    body = {"model": "llama", "prompt": prompt, "max_tokens": new, "temperature": 0, "ignore_eos": True}
    status, answer = call(url, "/v1/completions", body)
    assert status == 200
    assert answer["choices"][0]["token_ids"] == ref["greedy"][0, len(prompt):].tolist()
    assert answer["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": new, "total_tokens": len(prompt) + new}


def test_metrics_endpoint_counts_what_was_served(server):
    _, url = server
    with urllib.request.urlopen(url + "/metrics", timeout=60) as response:
        assert response.status == 200 and response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    # the completion of the test above: one 200 on /v1/completions, its tokens and a first-token time
    assert 'mf_http_requests_total{route="/v1/completions",status="200"} 1.0' in text
    assert "mf_generation_tokens_total " in text and "mf_time_to_first_token_seconds_count 1.0" in text
    assert "mf_requests_waiting 0.0" in text and "mf_engine_healthy 1.0" in text


def test_errors_are_openai_shaped(server):
    _, url = server
    for path, body, status, param in (("/v1/completions", {"prompt": "text"}, 400, "prompt"),
                                      ("/v1/completions", {"prompt": [1], "max_tokens": 64}, 400, "max_tokens"),
                                      ("/v1/completions", {"prompt": [1], "model": "other"}, 404, "model"),
                                      ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}, 400,
                                       "messages")):
        code, answer = call(url, path, body)
        assert code == status and answer["error"]["param"] == param, answer
    code, answer = call(url, "/nope")
    assert code == 404 and answer["error"]["type"] == "invalid_request_error"


def test_sigterm_stops_the_server_cleanly(server):
    proc, url = server
    proc.terminate()
    assert proc.wait(60) == 0
    port = int(url.rsplit(":", 1)[1])
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_bad_source_and_taken_port_exit_2(tmp_path):
    missing = subprocess.run([sys.executable, "-m", "mf_cli.main", "serve", str(tmp_path / "none"), "--port", "0"],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.strip().splitlines() == [f"mf serve: error: {tmp_path / 'none'}: no such file or directory"]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        busy = subprocess.run([sys.executable, "-m", "mf_cli.main", "serve", str(tmp_path), "--port", str(port)],
                              capture_output=True, text=True)
    assert busy.returncode == 2 and busy.stderr.strip().startswith("mf serve: error: --host/--port: cannot listen on")
    assert len(busy.stderr.strip().splitlines()) == 1
