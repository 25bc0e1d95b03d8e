"""The OpenAI-compatible app over a running engine thread (Starlette's TestClient; the real server
process is tested through `mf serve` in mf-cli and tests-integration): answers equal the engine's
greedy reference, streaming equals non-streaming, and every kind of bad request is a 4xx in
OpenAI's error shape."""

from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient

import mf_models
from mf_models.inference import InferenceEngine
from mf_models.serving import EngineRunner, ServerLimits, create_app


class CharTokenizer:
    """Printable ASCII as ids 3..97 (0-2 are specials, 2 = EOS); chat = 'role: content' lines."""

    def encode(self, text):
        return [ord(c) - 29 for c in text]

    def decode(self, ids):
        return "".join(chr(i + 29) for i in ids if 3 <= i < 98)

    def encode_chat(self, messages):
        if messages[-1]["role"] == "assistant":
            raise ValueError("the last message must not be the assistant's")
        return self.encode("".join(f"{m['role']}: {m['content']} | " for m in messages) + "assistant:")


TOK = CharTokenizer()


@pytest.fixture(scope="module")
def model():
    return mf_models.build_model(mf_models.tiny_model_section("llama", vocab_size=100, eos_token_id=2), seed=4)


@pytest.fixture(scope="module")
def runner(model):
    runner = EngineRunner(InferenceEngine(model, max_slots=3, max_len=48))
    runner.start()
    yield runner
    runner.stop()


@pytest.fixture(scope="module")
def client(runner):
    with TestClient(create_app(runner, tokenizer=TOK, model_name="tiny",
                               limits=ServerLimits(max_request_bytes=4000, max_tokens=20))) as client:
        yield client


def greedy(model, ids, new):
    """Reference continuation: the recompute path, cut at EOS (2) like the engine."""
    out = mf_models.generate(model, ids, new, eos_token_id=[], use_cache=False)[len(ids):].tolist()
    return out[:out.index(2)] if 2 in out else out


def test_health_and_models(client):
    assert client.get("/health").json()["status"] == "ok"
    data = client.get("/v1/models").json()["data"]
    assert [(m["id"], m["object"], m["max_model_len"]) for m in data] == [("tiny", "model", 48)]


def test_completion_text_and_ids_equal_greedy(client, model):
    body = client.post("/v1/completions", json={"model": "tiny", "prompt": "Hi there", "max_tokens": 7,
                                                "temperature": 0}).json()
    expected = greedy(model, TOK.encode("Hi there"), 7)
    (choice,) = body["choices"]
    assert body["object"] == "text_completion" and choice["token_ids"] == expected
    assert choice["text"] == TOK.decode(expected)
    assert choice["finish_reason"] == ("length" if len(expected) == 7 else "stop")
    assert body["usage"] == {"prompt_tokens": 8, "completion_tokens": 7, "total_tokens": 15}
    echo = client.post("/v1/completions", json={"prompt": "Hi there", "max_tokens": 7, "temperature": 0,
                                                "echo": True}).json()
    assert echo["choices"][0]["text"] == "Hi there" + choice["text"]


def test_batched_ids_prompts_and_seeded_choices(client, model):
    prompts = [[40, 41, 42], [50, 9, 60, 70, 71]]
    body = client.post("/v1/completions", json={"prompt": prompts, "max_tokens": 5, "n": 2, "seed": 3,
                                                "temperature": 1.0, "top_p": 0.9}).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    again = client.post("/v1/completions", json={"prompt": prompts, "max_tokens": 5, "n": 2, "seed": 3,
                                                 "temperature": 1.0, "top_p": 0.9}).json()
    assert [c["token_ids"] for c in again["choices"]] == [c["token_ids"] for c in body["choices"]]
    assert body["usage"]["prompt_tokens"] == 2 * 3 + 2 * 5
    greedy_body = client.post("/v1/completions", json={"prompt": prompts, "max_tokens": 5, "temperature": 0}).json()
    assert [c["token_ids"] for c in greedy_body["choices"]] == [greedy(model, p, 5) for p in prompts]


def test_chat_and_its_stream(client, model):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hey"}]}]
    body = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 6, "temperature": 0}).json()
    expected = greedy(model, TOK.encode_chat([{"role": "system", "content": "be brief"},
                                              {"role": "user", "content": "hey"}]), 6)
    (choice,) = body["choices"]
    assert body["object"] == "chat.completion" and choice["message"] == {"role": "assistant", "content": TOK.decode(expected)}
    events = stream(client, "/v1/chat/completions", {"messages": messages, "max_tokens": 6, "temperature": 0,
                                                     "stream": True, "stream_options": {"include_usage": True}})
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[1:-1]) == choice["message"]["content"]
    assert events[-2]["choices"][0]["finish_reason"] == choice["finish_reason"]
    assert events[-1]["choices"] == [] and events[-1]["usage"] == body["usage"]


def stream(client, url, body):
    with client.stream("POST", url, json=body) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[len("data: "):]) for line in lines[:-1]]


def test_streamed_completion_and_stop_strings(client, model):
    ids = TOK.encode("abc")
    full = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 12, "temperature": 0,
                                                "ignore_eos": True}).json()["choices"][0]
    events = stream(client, "/v1/completions", {"prompt": "abc", "max_tokens": 12, "temperature": 0,
                                                "ignore_eos": True, "stream": True})
    assert "".join(e["choices"][0]["text"] for e in events) == full["text"]
    assert sum((e["choices"][0]["token_ids"] for e in events), []) == full["token_ids"]
    text = full["text"]
    assert len(text) >= 6, text
    stop = text[3:5]
    cut = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
                                               "stop": [stop, "\x7f never"]}).json()["choices"][0]
    assert cut["text"] == text[:text.index(stop)] and cut["finish_reason"] == "stop"
    streamed = stream(client, "/v1/completions", {"prompt": ids, "max_tokens": 12, "temperature": 0,
                                                  "ignore_eos": True, "stop": stop, "stream": True})
    assert "".join(e["choices"][0]["text"] for e in streamed) == cut["text"]
    assert streamed[-1]["choices"][0]["finish_reason"] == "stop"


BAD = [
    ("/v1/completions", {"prompt": "x", "frobnicate": 1}, 400, "frobnicate"),
    ("/v1/completions", {"prompt": "x", "logprobs": 3}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "x", "presence_penalty": 0.5}, 400, "presence_penalty"),
    ("/v1/completions", {"prompt": "x", "temperature": 3}, 400, "temperature"),
    ("/v1/completions", {"prompt": "x", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 21}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x" * 40, "max_tokens": 20}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x" * 60}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1, 200]}, 400, "prompt"),
    ("/v1/completions", {"prompt": []}, 400, "prompt"),
    ("/v1/completions", {"prompt": "x", "n": 9}, 400, "n"),
    ("/v1/completions", {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("/v1/completions", {"prompt": "x", "best_of": 3}, 400, "best_of"),
    ("/v1/completions", {"prompt": "x", "model": "gpt-4"}, 404, "model"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "name": "bob"}]}, 400, "messages[0].name"),
    ("/v1/chat/completions", {"messages": [{"role": "assistant", "content": "x"}]}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, 400, "tools"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "response_format": {"type": "json_object"}}, 400, "response_format"),
    # bounds and types of every sampling field, checked before anything reaches the engine thread
    ("/v1/completions", {"prompt": "x", "top_k": 100000000000000000000}, 400, "top_k"),
    ("/v1/completions", {"prompt": "x", "top_k": 101}, 400, "top_k"),           # above the vocabulary (100)
    ("/v1/completions", {"prompt": "x", "top_k": -2}, 400, "top_k"),
    ("/v1/completions", {"prompt": "x", "top_k": 2.5}, 400, "top_k"),
    ("/v1/completions", {"prompt": "x", "temperature": float("nan")}, 400, "temperature"),
    ("/v1/completions", {"prompt": "x", "temperature": float("inf")}, 400, "temperature"),
    ("/v1/completions", {"prompt": "x", "temperature": 10**400}, 400, "temperature"),
    ("/v1/completions", {"prompt": "x", "top_p": float("nan")}, 400, "top_p"),
    ("/v1/completions", {"prompt": "x", "seed": 2**64}, 400, "seed"),
    ("/v1/completions", {"prompt": "x", "seed": -1}, 400, "seed"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 10**30}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "n": 10**30}, 400, "n"),
    ("/v1/completions", {"prompt": "x", "stop_token_ids": [10**30]}, 400, "stop_token_ids"),
    ("/v1/completions", {"prompt": "x", "stop_token_ids": [-1]}, 400, "stop_token_ids"),
    ("/v1/completions", {"prompt": "x", "stop_token_ids": list(range(65))}, 400, "stop_token_ids"),
    ("/v1/completions", {"prompt": [99999]}, 400, "prompt"),
    ("/v1/completions", {"prompt": [-1]}, 400, "prompt"),
    ("/v1/completions", {"prompt": [10**30]}, 400, "prompt"),
    ("/v1/completions", {"prompt": [[5], [6, 10**30]]}, 400, "prompt"),
    ("/v1/completions", {"prompt": [5], "echo": True, "max_tokens": 2, "top_k": [3]}, 400, "top_k"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_p": float("nan")}, 400, "top_p"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_k": 10**20}, 400, "top_k"),
]


@pytest.mark.parametrize("url,body,status,param", BAD, ids=[b[3] + str(i) for i, b in enumerate(BAD)])
def test_bad_requests_get_openai_errors(client, url, body, status, param):
    # json.dumps writes NaN / Infinity literals, as some clients do (httpx's json= refuses them)
    response = client.post(url, content=json.dumps(body).encode(), headers={"content-type": "application/json"})
    assert response.status_code == status
    error = response.json()["error"]
    assert error["param"] == param and error["message"] and error["type"] == "invalid_request_error"


def test_transport_errors_are_json_too(client):
    cases = [(client.post("/v1/completions", content=b"{nope"), 400),
             (client.post("/v1/completions", content=b"[1]"), 400),
             (client.post("/v1/completions", content=b"[" * 1990 + b"]" * 1990), 400),   # nested too deeply
             (client.post("/v1/completions", content=b'{"prompt": ' + b"[" * 900 + b"]" * 900 + b"}"), 400),
             (client.post("/v1/completions", json={"prompt": "y" * 5000}), 413),
             (client.get("/v1/completions"), 405),
             (client.get("/v2/anything"), 404)]
    for response, status in cases:
        assert response.status_code == status and set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert client.get("/health").json()["status"] == "ok"


def test_without_tokenizer_ids_work_and_text_is_refused(runner, model):
    with TestClient(create_app(runner, model_name="ids-only")) as client:
        body = client.post("/v1/completions", json={"prompt": [44, 45], "max_tokens": 3, "temperature": 0}).json()
        assert body["choices"][0]["token_ids"] == greedy(model, [44, 45], 3) and body["choices"][0]["text"] == ""
        for url, request, param in (("/v1/completions", {"prompt": "text"}, "prompt"),
                                    ("/v1/completions", {"prompt": [44], "stop": "x"}, "stop"),
                                    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}, "messages")):
            response = client.post(url, json=request)
            assert response.status_code == 400 and response.json()["error"]["param"] == param


def test_full_queue_and_failed_engine_give_5xx(model):
    engine = InferenceEngine(model, max_slots=1, max_len=16)
    fatal = []
    runner = EngineRunner(engine, on_fatal=fatal.append)
    runner.start()
    try:
        with TestClient(create_app(runner, limits=ServerLimits(max_waiting=1))) as client:
            busy = client.post("/v1/completions", json={"prompt": [5], "n": 2, "max_tokens": 2})
            assert busy.status_code == 503 and busy.json()["error"]["type"] == "server_overloaded"

            def broken(active):
                raise RuntimeError("device lost")

            engine._decode_all = broken
            # Each failing step fails its own request; the engine gives up after 3 in a row.
            for _ in range(3):
                failed = client.post("/v1/completions", json={"prompt": [5], "max_tokens": 2})
                assert failed.status_code == 500 and failed.json()["error"]["type"] == "server_error"
            runner._thread.join(120)   # generous: the shared CI machine can be slow to schedule the thread
            health = client.get("/health")
            assert health.status_code == 503 and "device lost" in health.json()["detail"]
            assert client.post("/v1/completions", json={"prompt": [5], "max_tokens": 2}).status_code == 503
            assert len(fatal) == 1 and "3 decode steps failed in a row" in str(fatal[0])
    finally:
        runner.stop()


def test_a_failing_request_fails_alone(model):
    """A step that raises for one request's prefill ends that request only: the others answer,
    /health stays ok, and the engine serves the next requests."""
    engine = InferenceEngine(model, max_slots=2, max_len=24)
    runner = EngineRunner(engine)
    runner.start()
    real = engine._prefill_one

    def poisoned(request):
        if request.prompt_ids[0] == 66:
            raise OverflowError("Python int too large to convert to C int")
        real(request)

    engine._prefill_one = poisoned
    try:
        with TestClient(create_app(runner)) as client:
            for _ in range(4):  # more than max_consecutive_failures: successes in between reset it
                bad = client.post("/v1/completions", json={"prompt": [66, 5], "max_tokens": 3, "temperature": 0})
                assert bad.status_code == 500
                good = client.post("/v1/completions", json={"prompt": [44, 45], "max_tokens": 3, "temperature": 0})
                assert good.status_code == 200 and good.json()["choices"][0]["token_ids"] == greedy(model, [44, 45], 3)
            assert client.get("/health").json()["status"] == "ok" and runner.healthy
            assert engine.stats.failed_requests == 4
    finally:
        runner.stop()
