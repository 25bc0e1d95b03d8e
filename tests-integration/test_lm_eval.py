"""lm-evaluation-harness both ways on one tiny checkpoint, with three small local tasks made here
(`dataset_path: json`): 30 multiple-choice items (loglikelihood), 6 documents
(loglikelihood_rolling) and 6 questions (generate_until).

- lm-eval's own CLI (`python -m lm_eval`, the `eval` extra in this venv) against `mf serve` on
  127.0.0.1 (`local-completions`, which finds the server's tokenizer at /tokenizer_info and
  /tokenize and sends token ids with `echo` and `logprobs`): exit 0, an accuracy;
- `mf eval CHECKPOINT --tasks ...` in process (mf_cli.harness);
- every item's loglikelihood from both equals a teacher-forced forward of the model here within
  1e-5 (the rolling documents' sums within 1e-5 of each other and 1e-6 relative of the forward),
  and the generations equal each other and the model's greedy continuation cut at the stop string.

The same server answers the official `openai` client's completions and chat logprobs, streamed and
not. Cost: two lm-eval start-ups (it indexes its ~15k bundled tasks each time), one server compile.
"""

from __future__ import annotations

import glob
import json
import os
import random
import subprocess
import sys
import threading

import numpy as np
import openai
import pytest

import mf_ckpt
import mf_data
import mf_models

VOCAB = 160
WORDS = ["class", "function", "statement", "loop", "module", "import", "value", "name", "list", "string", "the",
         "for", "while", "return"]
TASKS = "mf_tiny_mc,mf_tiny_ppl,mf_tiny_gen"


def _task(name: str, data: str, body: str) -> str:
    return (f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
            f"test_split: test\n{body}")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from pydoc_data.topics import topics

    root = tmp_path_factory.mktemp("lm_eval")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in list(topics.values())[:40]), encoding="utf-8")
    spm = str(root / "spm.model")
    mf_data.train_sentencepiece([str(corpus)], spm, VOCAB)
    # small weights: log-probabilities near log(1/160) each, so float32's rounding stays far below 1e-5
    section = mf_models.tiny_model_section("llama", vocab_size=VOCAB, max_position_embeddings=128,
                                           initializer_range=0.02)
    model = mf_models.build_model(section, seed=11)
    ckpt = root / "tiny-eval"
    mf_ckpt.save(str(ckpt), 1, mf_models.model_state(model), common={"step": 1, "hf_config": section})
    rng = random.Random(0)

    def words(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    tasks = root / "tasks"
    tasks.mkdir()
    mc = [{"question": f"Question: {words(4)}\nAnswer:", "choices": [words(rng.randint(1, 2)) for _ in range(4)],
           "answer": rng.randrange(4)} for _ in range(30)]
    docs = [{"text": words(rng.randint(8, 20)) + "."} for _ in range(6)]
    gen = [{"question": f"{words(3)}:", "answer": words(2)} for _ in range(6)]
    for name, rows in (("mc", mc), ("docs", docs), ("gen", gen)):
        (tasks / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tasks / "mf_tiny_mc.yaml").write_text(_task("mf_tiny_mc", tasks / "mc.jsonl", (
        'output_type: multiple_choice\ndoc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{answer}}"\nmetric_list:\n  - metric: acc\n    aggregation: mean\n'
        "    higher_is_better: true\n")))
    (tasks / "mf_tiny_ppl.yaml").write_text(_task("mf_tiny_ppl", tasks / "docs.jsonl", (
        'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\n'
        "metric_list:\n  - metric: word_perplexity\n  - metric: bits_per_byte\n")))
    (tasks / "mf_tiny_gen.yaml").write_text(_task("mf_tiny_gen", tasks / "gen.jsonl", (
        'output_type: generate_until\ndoc_to_text: "{{question}}"\ndoc_to_target: "{{answer}}"\n'
        'generation_kwargs:\n  until: ["."]\n  max_gen_toks: 10\n  do_sample: false\n'
        "metric_list:\n  - metric: exact_match\n")))
    env = {**os.environ, "GLOG_v": "3", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(root / "hf-datasets"), "NO_PROXY": "127.0.0.1", "TOKENIZERS_PARALLELISM": "false"}
    return {"root": root, "ckpt": str(ckpt), "spm": spm, "tasks": str(tasks), "model": model, "env": env,
            "tok": mf_data.SentencePieceTokenizer(spm)}


@pytest.fixture(scope="module")
def url(setup):
    log = open(setup["root"] / "serve.log", "w+")  # a file: a full pipe would block the server
    proc = subprocess.Popen([sys.executable, "-m", "mf_cli.main", "serve", setup["ckpt"], "--tokenizer", setup["spm"],
                             "--port", "0", "--max-slots", "4"], stdout=subprocess.PIPE, stderr=log, text=True,
                            env=setup["env"])
    found: list[str] = []
    reader = threading.Thread(target=lambda: found.extend(line.split()[-1] for line in proc.stdout
                                                          if line.startswith("mf serve: listening on ")), daemon=True)
    reader.start()
    for _ in range(1200):
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


def _samples(directory: str, task: str) -> dict[int, dict]:
    (path,) = glob.glob(os.path.join(directory, "*", f"samples_{task}_*.jsonl"))
    return {row["doc_id"]: row for row in map(json.loads, open(path, encoding="utf-8"))}


def _results(directory: str) -> dict:
    (path,) = glob.glob(os.path.join(directory, "*", "results_*.json"))
    return json.loads(open(path, encoding="utf-8").read())["results"]


@pytest.fixture(scope="module")
def runs(setup, url):
    """lm-eval's CLI against the server, and mf eval in process: their output directories."""
    root, env = setup["root"], setup["env"]
    # side by side: lm-eval mostly waits for the server while mf eval computes
    served = subprocess.Popen([sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args",
                               f"model=tiny-eval,base_url={url}/v1/completions,max_length=128", "--tasks", TASKS,
                               "--include_path", setup["tasks"], "--log_samples", "--output_path", str(root / "served")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=root)
    local = subprocess.Popen([sys.executable, "-m", "mf_cli.main", "eval", setup["ckpt"], "--tokenizer", setup["spm"],
                              "--tasks", TASKS, "--include-path", setup["tasks"], "--log-samples", "--output-path",
                              str(root / "local")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             cwd=root)
    local_out, local_err = local.communicate(timeout=1200)
    _, served_err = served.communicate(timeout=1200)
    assert served.returncode == 0, served_err[-3000:]
    assert "remote tokenizer" in served_err.lower()   # found /tokenizer_info and /tokenize: no hub
    assert local.returncode == 0, local_err[-3000:]
    return {"served": str(root / "served"), "local": str(root / "local"), "stdout": local_out}


def _encode_pair(tok, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's TemplateLM._encode_pair with mf's tokenizer (trailing spaces move to the continuation)."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole, head = tok.encode([context + continuation])[0], tok.encode([context])[0]
    return head, whole[len(head):]


def _forward(model, sequences: list[list[int]], length: int) -> np.ndarray:
    """float64 logits [N, length, V] of one PyNative forward over the sequences right-padded to
    `length` (a causal model: what follows a token never changes its logits; one shape, so
    PyNative prepares its kernels once)."""
    from mindspore import Tensor

    batch = np.zeros((len(sequences), length), np.int32)
    for row, ids in enumerate(sequences):
        batch[row, :len(ids)] = ids
    return model(Tensor(batch)).asnumpy().astype(np.float64)


def _forward_logprobs(model, sequences: list[list[int]]) -> list[np.ndarray]:
    """log p(ids[i] | ids[:i]) for i >= 1 of each sequence (teacher-forced; softmax in float64)."""
    logits = _forward(model, [s[:-1] for s in sequences], max(len(s) for s in sequences) - 1)
    top = logits.max(-1, keepdims=True)
    logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    return [logp[row, np.arange(len(s) - 1), s[1:]] for row, s in enumerate(sequences)]


def _greedy(model, prompts: list[list[int]], new: int, eos: int) -> list[list[int]]:
    """Greedy continuations by whole forwards (no cache), cut at EOS."""
    out: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    length = max(len(p) for p in prompts) + new
    for _ in range(new):
        logits = _forward(model, [p + o for p, o in zip(prompts, out)], length)
        for row, (prompt, tokens) in enumerate(zip(prompts, out)):
            token = int(logits[row, len(prompt) + len(tokens) - 1].argmax())
            if not done[row]:
                done[row] = token == eos
                tokens.extend([] if done[row] else [token])
    return out


def test_lm_eval_against_mf_serve_equals_mf_eval_in_process_and_the_forward(setup, runs, pynative):
    served, local = runs["served"], runs["local"]
    acc = _results(served)["mf_tiny_mc"]["acc,none"]
    assert 0.0 <= acc <= 1.0 and _results(local)["mf_tiny_mc"]["acc,none"] == acc
    assert f"mf eval: mf_tiny_mc: acc {acc:.4f}" in runs["stdout"]
    tok, model = setup["tok"], setup["model"]
    a, b = _samples(served, "mf_tiny_mc"), _samples(local, "mf_tiny_mc")
    assert sorted(a) == sorted(b) == list(range(30))
    items = []   # (doc, choice, context ids, continuation ids)
    for doc in a:
        for k, args in enumerate(a[doc]["arguments"].values()):   # {"gen_args_0": {"arg_0": context, "arg_1": ...}}
            items.append((doc, k, *_encode_pair(tok, args["arg_0"], args["arg_1"])))
    forwards = _forward_logprobs(model, [ctx + cont for _, _, ctx, cont in items])
    worst = 0.0
    for (doc, k, _, cont), logprobs in zip(items, forwards):
        reference = float(logprobs[-len(cont):].sum())
        server, in_process = (float(s[doc]["resps"][k][0][0]) for s in (a, b))
        worst = max(worst, abs(server - reference), abs(in_process - reference))
    assert worst < 1e-5, worst
    print(f"loglikelihoods of {len(items)} choices: server and in-process within {worst:.2e} of the forward")
    # perplexity documents: [prefix token] + the document, scored whole (each fits one window)
    a, b = _samples(served, "mf_tiny_ppl"), _samples(local, "mf_tiny_ppl")
    docs = sorted(a)
    forwards = _forward_logprobs(model, [[tok.bos] + tok.encode([a[d]["doc"]["text"]])[0] for d in docs])
    for doc, logprobs in zip(docs, forwards):
        reference = float(logprobs.sum())
        server, in_process = float(a[doc]["resps"][0][0]), float(b[doc]["resps"][0][0])
        assert server == pytest.approx(in_process, abs=1e-5) and server == pytest.approx(reference, rel=1e-6)
    # generations: the same text both ways, the model's greedy continuation up to the stop string
    a, b = _samples(served, "mf_tiny_gen"), _samples(local, "mf_tiny_gen")
    docs = sorted(a)
    prompts = [tok.encode([a[d]["doc"]["question"]])[0] for d in docs]
    for doc, prompt, out in zip(docs, prompts, _greedy(model, prompts, 10, tok.eod)):
        text = tok.decode(prompt + out)[len(tok.decode(prompt)):].split(".")[0]
        assert a[doc]["resps"][0][0] == b[doc]["resps"][0][0] == text


def test_openai_client_reads_logprobs(url):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    completion = client.completions.create(model="tiny-eval", prompt="The for statement", max_tokens=4, temperature=0,
                                           logprobs=3, echo=True)
    lp = completion.choices[0].logprobs
    assert lp.token_logprobs[0] is None and len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset)
    assert "".join(lp.tokens) == completion.choices[0].text and all(len(t) <= 4 for t in lp.top_logprobs[1:])
    streamed = list(client.completions.create(model="tiny-eval", prompt="The for statement", max_tokens=4,
                                              temperature=0, logprobs=3, echo=True, stream=True))
    assert [t for c in streamed for t in (c.choices[0].logprobs.token_logprobs if c.choices else [])] == \
        lp.token_logprobs
    messages = [{"role": "user", "content": "Hi"}]
    chat = client.chat.completions.create(model="tiny-eval", messages=messages, max_tokens=5, temperature=0,
                                          logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert "".join(c.token for c in content) == chat.choices[0].message.content
    assert all(len(c.top_logprobs) == 2 and c.top_logprobs[0].logprob == c.logprob for c in content)
    chunks = list(client.chat.completions.create(model="tiny-eval", messages=messages, max_tokens=5, temperature=0,
                                                 logprobs=True, top_logprobs=2, stream=True))
    assert [c.logprob for k in chunks if k.choices and k.choices[0].logprobs
            for c in k.choices[0].logprobs.content] == [c.logprob for c in content]


@pytest.fixture
def pynative():
    import mindspore as ms

    before = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    yield
    ms.set_context(mode=before)
