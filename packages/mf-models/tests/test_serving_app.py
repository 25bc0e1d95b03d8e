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
    ("/v1/completions", {"prompt": "x", "logprobs": 21}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "x", "logprobs": -1}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "x", "logprobs": True}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": -1, "echo": True}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, 400, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21},
     400, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": 1}, 400, "logprobs"),
    # a lone surrogate is valid JSON (an escape) but no text: a 400 naming where, never a 500
    ("/v1/completions", {"prompt": "a\ud800b"}, 400, "prompt"),
    ("/v1/completions", {"prompt": ["ok", "\udfff"]}, 400, "prompt"),
    ("/v1/completions", {"prompt": "x", "model": "\ud83d"}, 400, "model"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud800"}]}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udc00"}]}]},
     400, "messages"),
    ("/v1/completions", {"prompt": "x", "\ud800": 1}, 400, None),
    ("/tokenize", {"prompt": "\ud800"}, 400, "prompt"),
    ("/tokenize", {"prompt": 5}, 400, "prompt"),
    ("/tokenize", {"prompt": "x", "messages": []}, 400, "prompt"),
    ("/tokenize", {"prompt": "x", "add_generation_prompt": True}, 400, "add_generation_prompt"),
    ("/tokenize", {"prompt": "x", "frobnicate": 1}, 400, "frobnicate"),
    ("/tokenize", {"prompt": "x", "model": "gpt-4"}, 404, "model"),
    ("/detokenize", {"tokens": [5, 100]}, 400, "tokens"),
    ("/detokenize", {"tokens": "5"}, 400, "tokens"),
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


@pytest.mark.parametrize("url,body,status,param", BAD, ids=[f"{b[3]}{i}" for i, b in enumerate(BAD)])
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
    too_long = client.post("/v1/completions", json={"prompt": "x" * 60}).json()["error"]
    assert too_long["code"] == "context_length_exceeded"
    assert client.post("/v1/completions", json={"prompt": "y" * 5000}).json()["error"]["code"] == "request_too_large"


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
    """A prefill call that raises ends the requests it was seating only: the others answer,
    /health stays ok, and the engine serves the next requests."""
    engine = InferenceEngine(model, max_slots=2, max_len=24)
    runner = EngineRunner(engine)
    runner.start()
    real = engine._prefill_together

    def poisoned(requests):
        if any(request.prompt_ids[0] == 66 for request in requests):
            raise OverflowError("Python int too large to convert to C int")
        real(requests)

    engine._prefill_together = poisoned
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


# ---- /metrics (Prometheus) and request defaults from the generation config ----------------------
def _samples(text: str) -> dict[str, float]:
    """{'name{labels}': value} of Prometheus' text format, parsed by prometheus_client's own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def test_metrics_count_requests_tokens_and_latencies(runner):
    with TestClient(create_app(runner, tokenizer=TOK, model_name="tiny")) as client:
        before = _samples(client.get("/metrics").text)
        assert before['mf_engine_healthy{}'] == 1.0 and before['mf_requests_waiting{}'] == 0.0
        body = client.post("/v1/completions", json={"prompt": "Hi there", "max_tokens": 5, "temperature": 0}).json()
        client.post("/v1/completions", json={"prompt": "x", "max_tokens": 0.5})       # a 400
        client.get("/no/such/route")                                                    # a 404, as "other"
        response = client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    after = _samples(response.text)
    done = body["usage"]["completion_tokens"]
    assert after['mf_http_requests_total{route="/v1/completions",status="200"}'] == 1
    assert after['mf_http_requests_total{route="/v1/completions",status="400"}'] == 1
    assert after['mf_http_requests_total{route="other",status="404"}'] == 1
    assert after['mf_prompt_tokens_total{}'] == 8 and after['mf_generation_tokens_total{}'] == done
    assert after['mf_time_to_first_token_seconds_count{}'] == 1
    assert after['mf_request_generation_tokens_sum{}'] == done
    assert after['mf_http_request_duration_seconds_count{route="/v1/completions"}'] == 2


def test_requests_follow_the_generation_config(runner, model):
    from mf_models.serving import SamplingDefaults

    greedy_defaults = SamplingDefaults.from_generation_config({"do_sample": False, "temperature": 0.7,
                                                               "max_new_tokens": 4}, "generation_config.json")
    assert (greedy_defaults.temperature, greedy_defaults.max_tokens) == (0.0, 4)
    assert "greedy" in greedy_defaults.describe()
    with TestClient(create_app(runner, tokenizer=TOK, model_name="tiny", defaults=greedy_defaults)) as client:
        # no temperature, no max_tokens: greedy and 4 tokens, as generate() would do with that config
        first = client.post("/v1/completions", json={"prompt": "Hi there"}).json()["choices"][0]
        again = client.post("/v1/completions", json={"prompt": "Hi there", "seed": 9}).json()["choices"][0]
        given = client.post("/v1/completions", json={"prompt": "Hi there", "max_tokens": 6,
                                                     "temperature": 0}).json()["choices"][0]
    assert first["token_ids"] == again["token_ids"] == greedy(model, TOK.encode("Hi there"), 4)
    assert given["token_ids"] == greedy(model, TOK.encode("Hi there"), 6)     # the request's own values win
    sampled = SamplingDefaults.from_generation_config({"do_sample": True, "temperature": 0.6, "top_p": 0.9,
                                                       "top_k": 20})
    assert (sampled.temperature, sampled.top_p, sampled.top_k, sampled.max_tokens) == (0.6, 0.9, 20, None)
    assert SamplingDefaults.from_generation_config({}) == SamplingDefaults()


@pytest.mark.parametrize("config,needle", [
    ({"temperature": -1}, "temperature must be a number in (0.0, 100.0]"),
    ({"top_p": 1.5}, "top_p must be a number in (0.0, 1.0]"),
    ({"top_k": "many"}, "top_k must be an integer"),
    ({"max_new_tokens": 0}, "max_new_tokens must be an integer in [1,"),
    ({"do_sample": "yes"}, "do_sample must be true or false"),
])
def test_a_bad_generation_config_is_one_line(config, needle):
    from mf_models.serving import SamplingDefaults

    with pytest.raises(ValueError) as info:
        SamplingDefaults.from_generation_config(config, "gc.json")
    assert str(info.value).startswith("gc.json: ") and needle in str(info.value) and "\n" not in str(info.value)


def reference_engine(model):
    """An engine of its own for references (the server's runs on its thread)."""
    return InferenceEngine(model, max_slots=1, max_len=48)


def test_completion_logprobs_echo_and_prompt_scoring(client, model):
    from mf_models.inference import SamplingParams

    ids = TOK.encode("Hi there")
    (reference,) = reference_engine(model).generate([ids], SamplingParams(max_new_tokens=3, logprobs=2, prompt_logprobs=2))
    body = client.post("/v1/completions", json={"prompt": "Hi there", "max_tokens": 3, "temperature": 0,
                                                "logprobs": 2, "echo": True}).json()
    (choice,) = body["choices"]
    lp = choice["logprobs"]
    assert choice["token_ids"] == reference.output_ids == greedy(model, ids, 3)
    assert lp["tokens"] == list("Hi there") + [TOK.decode([t]) for t in reference.output_ids]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    expected = [e.logprob for e in reference.prompt_logprobs[1:]] + [e.logprob for e in reference.output_logprobs]
    assert lp["token_logprobs"][1:] == pytest.approx(expected, abs=1e-6)
    assert lp["text_offset"] == [len("".join(lp["tokens"][:i])) for i in range(len(ids) + 3)]
    for position, top in enumerate(lp["top_logprobs"][1:], 1):  # the 2 most likely and the chosen one
        assert 2 <= len(top) <= 3 and top[lp["tokens"][position]] == lp["token_logprobs"][position]
    # max_tokens 0 with echo: the prompt scored, nothing generated
    scored = client.post("/v1/completions", json={"prompt": [ids, ids[:4]], "max_tokens": 0, "echo": True,
                                                  "logprobs": 0}).json()
    first, second = scored["choices"]
    assert first["text"] == "Hi there" and first["token_ids"] == [] and first["finish_reason"] == "length"
    assert first["logprobs"]["token_logprobs"] == lp["token_logprobs"][:len(ids)]
    assert second["logprobs"]["token_logprobs"] == pytest.approx(lp["token_logprobs"][:4], abs=1e-6)
    assert scored["usage"]["completion_tokens"] == 0
    # the stream carries the same numbers, the prompt's with the first piece
    events = sse(client, "/v1/completions", {"prompt": "Hi there", "max_tokens": 3, "temperature": 0, "logprobs": 2,
                                             "echo": True})
    streamed = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for event in events:
        for key in streamed:
            streamed[key] += event["choices"][0]["logprobs"][key] if event["choices"] else []
    assert streamed == lp and "".join(e["choices"][0]["text"] for e in events if e["choices"]) == choice["text"]


def sse(client, url, body):
    with client.stream("POST", url, json={**body, "stream": True}) as response:
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


def test_chat_logprobs_in_the_chat_shape(client, model):
    from mf_models.inference import SamplingParams

    messages = [{"role": "user", "content": "Hi"}]
    body = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 4, "temperature": 0,
                                                     "logprobs": True, "top_logprobs": 3}).json()
    (reference,) = reference_engine(model).generate([TOK.encode_chat(messages)], SamplingParams(max_new_tokens=4, logprobs=3))
    content = body["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == [TOK.decode([t]) for t in reference.output_ids]
    assert [c["logprob"] for c in content] == pytest.approx([e.logprob for e in reference.output_logprobs], abs=1e-6)
    assert all(len(c["top_logprobs"]) == 3 and c["bytes"] == list(c["token"].encode()) for c in content)
    assert content[0]["top_logprobs"][0]["logprob"] == content[0]["logprob"]   # greedy: the chosen is the top
    events = sse(client, "/v1/chat/completions", {"messages": messages, "max_tokens": 4, "temperature": 0,
                                                  "logprobs": True, "top_logprobs": 3})
    assert [c for e in events[1:] for c in (e["choices"][0]["logprobs"] or {"content": []})["content"]] == content
    plain = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2, "logprobs": False})
    assert plain.json()["choices"][0]["logprobs"] is None


def test_tokenizer_endpoints(client):
    body = client.post("/tokenize", json={"prompt": "Hi there", "return_token_strs": True}).json()
    assert body == {"count": 8, "max_model_len": 48, "tokens": TOK.encode("Hi there"), "token_strs": list("Hi there")}
    chat = client.post("/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}).json()
    assert chat["tokens"] == TOK.encode_chat([{"role": "user", "content": "Hi"}])
    assert client.post("/detokenize", json={"tokens": body["tokens"]}).json() == {"prompt": "Hi there"}
    info = client.get("/tokenizer_info").json()
    assert info["model_max_length"] == 48 and "eos_token" in info and info["add_bos_token"] is False


def test_special_token_strings_in_text_are_their_tokens():
    from mf_models.serving import TextEncoder

    class WithSpecials(CharTokenizer):
        special_tokens = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": None}

        def token_to_id(self, text):
            return {"<s>": 1, "</s>": 2}.get(text)

    encoder = TextEncoder(WithSpecials())
    assert encoder.encode("<s>Hi</s> x") == [1, *TOK.encode("Hi"), 2, *TOK.encode(" x")]
    assert encoder.encode("Hi") == TOK.encode("Hi") and TextEncoder(TOK).encode("</s>") == TOK.encode("</s>")
