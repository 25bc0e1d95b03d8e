"""`mf serve` as a real server process (default GRAPH_MODE) from a predict YAML: a tiny llama
checkpoint and a sentencepiece tokenizer trained here. Text completions and chat (mf-data's
built-in chat template) equal to the model's greedy continuation, server-sent-event streams equal
to the whole answers, concurrent requests all answered and equal to their one-at-a-time answers,
the official `openai` client, and OpenAI-shaped errors (400, 404, 413)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

import mf_ckpt
import mf_data
import mf_models

VOCAB = 160
# Every prompt here fits the first prefill bucket (16 tokens) but the chat one, which takes the 64
# bucket: each bucket is one compile (seconds on busy cores), so the test asks for two only.
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from pydoc_data.topics import topics

    root = tmp_path_factory.mktemp("serve")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in list(topics.values())[:40]), encoding="utf-8")
    spm = str(root / "spm.model")
    mf_data.train_sentencepiece([str(corpus)], spm, VOCAB)
    section = mf_models.tiny_model_section("llama", vocab_size=VOCAB, max_position_embeddings=128, initializer_range=0.5)
    model = mf_models.build_model(section, seed=5)
    mf_ckpt.save(str(root / "ckpt"), 1, mf_models.model_state(model), common={"step": 1})
    # served from a predict YAML (a checkpoint directory or HF directory is what mf-cli's tests serve)
    config = {"run_mode": "predict", "model": section, "checkpoint": {"load_path": str(root / "ckpt")},
              "tokenizer": {"path": spm}, "inference": {"prompts": ["unused by mf serve"]}}
    (root / "tiny-llama.yaml").write_text(json.dumps(config))  # JSON is YAML
    return {"config": str(root / "tiny-llama.yaml"), "tok": mf_data.SentencePieceTokenizer(spm), "model": model}


@pytest.fixture(scope="module")
def url(tiny, tmp_path_factory):
    log = open(tmp_path_factory.mktemp("log") / "serve.log", "w+")  # a file: a full pipe would block the server
    proc = subprocess.Popen([sys.executable, "-m", "mf_cli.main", "serve", tiny["config"], "--port", "0", "--max-slots",
                             "4", "--max-len", "64", "--max-tokens", "24", "--max-request-bytes", "4000"],
                            stdout=subprocess.PIPE, stderr=log, text=True, env={**os.environ, "GLOG_v": "3"})
    found: list[str] = []
    reader = threading.Thread(target=lambda: found.extend(line.split()[-1] for line in proc.stdout
                                                          if line.startswith("mf serve: listening on ")), daemon=True)
    reader.start()
    for _ in range(600):
        if found or proc.poll() is not None:
            break
        reader.join(0.2)
    if not found:
        proc.kill()
        proc.wait()
        log.seek(0)
        pytest.fail(f"mf serve did not start: {log.read()[-3000:]}")
    yield found[0]
    proc.terminate()
    assert proc.wait(60) == 0
    log.close()


def greedy(tiny, ids: list[int], new: int) -> tuple[list[int], str]:
    """The reference: recompute-everything greedy, cut at EOS; the text that follows the prompt."""
    out = mf_models.generate(tiny["model"], ids, new, eos_token_id=[], use_cache=False)[len(ids):].tolist()
    eos = tiny["tok"].eod
    out = out[:out.index(eos)] if eos in out else out
    whole, head = tiny["tok"].decode(ids + out), tiny["tok"].decode(ids)
    return out, whole[len(head):]


def encode(tiny, text: str) -> list[int]:
    return tiny["tok"].encode([text])[0]


def test_health_models_and_text_completion(url, tiny):
    assert httpx.get(f"{url}/health").json()["status"] == "ok"
    assert [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]] == ["tiny-llama"]
    body = httpx.post(f"{url}/v1/completions", json={"model": "tiny-llama", "prompt": "The for statement",
                                                     "max_tokens": 12, "temperature": 0}, timeout=120).json()
    ids, text = greedy(tiny, encode(tiny, "The for statement"), 12)
    assert body["choices"][0]["text"] == text and body["choices"][0]["token_ids"] == ids
    assert body["usage"]["completion_tokens"] == len(ids) + (len(ids) < 12)  # a stop token counts


def test_chat_uses_the_tokenizers_chat_rendering(url, tiny):
    body = httpx.post(f"{url}/v1/chat/completions", json={"messages": CHAT, "max_tokens": 10, "temperature": 0},
                      timeout=120).json()
    prompt = mf_data.ChatEncoder(tiny["tok"]).encode_prompt(CHAT)
    assert body["usage"]["prompt_tokens"] == len(prompt) > 16
    ids, text = greedy(tiny, prompt, 10)
    assert body["choices"][0]["token_ids"] == ids
    assert body["choices"][0]["message"] == {"role": "assistant", "content": text}


def sse(url: str, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", f"{url}{path}", json={**body, "stream": True}, timeout=120) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


def test_streams_equal_whole_answers(url):
    request = {"prompt": "Exceptions are", "max_tokens": 14, "temperature": 0, "ignore_eos": True}
    whole = httpx.post(f"{url}/v1/completions", json=request, timeout=120).json()["choices"][0]
    events = sse(url, "/v1/completions", request)
    assert "".join(e["choices"][0]["text"] for e in events) == whole["text"]
    assert events[-1]["choices"][0]["finish_reason"] == "length" == whole["finish_reason"]
    chat = {"messages": CHAT, "max_tokens": 8, "temperature": 0}
    answer = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=120).json()["choices"][0]["message"]["content"]
    events = sse(url, "/v1/chat/completions", chat)
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == answer


def test_concurrent_requests_equal_one_at_a_time(url):
    prompts = ["The for statement", "A class", "import", "Built-in functions and exceptions", "while", "x",
               "The with statement", "Lambda expressions are"]
    requests = [{"prompt": p, "max_tokens": 6 + i % 5, "temperature": 0} for i, p in enumerate(prompts)]
    alone = [httpx.post(f"{url}/v1/completions", json=r, timeout=120).json()["choices"][0]["text"] for r in requests]
    with ThreadPoolExecutor(len(requests)) as pool:  # twice the slots: some wait, then join mid-flight
        together = list(pool.map(lambda r: httpx.post(f"{url}/v1/completions", json=r, timeout=120), requests))
    assert [r.status_code for r in together] == [200] * len(requests)
    assert [r.json()["choices"][0]["text"] for r in together] == alone


def test_official_openai_client(url, tiny):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    completion = client.completions.create(model="tiny-llama", prompt="The for statement", max_tokens=12, temperature=0)
    assert completion.choices[0].text == greedy(tiny, encode(tiny, "The for statement"), 12)[1]
    chat = client.chat.completions.create(model="tiny-llama", messages=CHAT, max_tokens=8, temperature=0)
    streamed = client.chat.completions.create(model="tiny-llama", messages=CHAT, max_tokens=8, temperature=0,
                                              stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == chat.choices[0].message.content
    assert chat.usage.prompt_tokens > 0 and chat.choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model="tiny-llama", prompt="x", max_tokens=500)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x")


def test_errors_are_4xx_json(url):
    for request, status, param in (({"prompt": "x", "max_tokens": 25}, 400, "max_tokens"),
                                   ({"prompt": "x", "top_p": 0}, 400, "top_p"),
                                   ({"prompt": "x", "logit_bias": {"5": 3}}, 400, "logit_bias"),
                                   ({"prompt": "x" * 5000}, 413, None)):
        response = httpx.post(f"{url}/v1/completions", json=request, timeout=60)
        assert response.status_code == status and response.json()["error"]["param"] == param
    assert httpx.post(f"{url}/v1/completions", content=b"not json", timeout=60).status_code == 400
    assert httpx.get(f"{url}/health").json()["status"] == "ok"
