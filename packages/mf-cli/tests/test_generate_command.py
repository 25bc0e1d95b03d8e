"""`mf generate`, through the real entry point: HF fixtures (greedy tokens equal transformers'), an
mf checkpoint with a sentencepiece tokenizer trained here (no YAML needed), a `run_mode: predict`
YAML, stop strings, and bad input (exit 2, one line, nothing written) / failures (exit 1)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

import mf_ckpt
import mf_data
import mf_models
from mf_cli.main import main

PROMPTS = ["The for statement", "A class definition defines"]
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny llama saved as mf-trainer saves it (hf_config + the training YAML's tokenizer.path),
    with a 160-piece sentencepiece model trained on Python's own documentation."""
    from pydoc_data.topics import topics

    root = tmp_path_factory.mktemp("tiny")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in list(topics.values())[:40]), encoding="utf-8")
    spm = str(root / "spm.model")
    mf_data.train_sentencepiece([str(corpus)], spm, 160)
    tok = mf_data.SentencePieceTokenizer(spm)
    section = mf_models.tiny_model_section("llama", vocab_size=160, max_position_embeddings=96, initializer_range=0.5)
    model = mf_models.build_model(section, seed=2)
    mf_ckpt.save(str(root / "ckpt"), 5, mf_models.model_state(model),
                 common={"step": 5, "hf_config": section, "train_config": {"tokenizer": {"path": spm}}})
    return {"root": root, "ckpt": str(root / "ckpt"), "spm": spm, "tok": tok, "model": model, "section": section}


def greedy_text(tiny, prompt: str, new: int, stop_at_eos: bool = True) -> tuple[list[int], str]:
    ids = tiny["tok"].encode([prompt])[0]
    out = mf_models.generate(tiny["model"], ids, new, eos_token_id=[], use_cache=False)[len(ids):].tolist()
    eos = tiny["tok"].eod
    if stop_at_eos and eos in out:
        out = out[:out.index(eos)]
    # the text that follows the prompt (a completion's first word keeps its leading space)
    whole, head = tiny["tok"].decode(ids + out), tiny["tok"].decode(ids)
    assert whole.startswith(head)
    return out, whole[len(head):]


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


def one_error_line(capsys) -> str:
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert out == "" and len(lines) == 1, err
    assert lines[0].startswith("mf generate: error: ")
    return lines[0]


@pytest.mark.parametrize("name,mode", [("llama", "graph"), ("qwen3", "pynative")])  # all three: mf-models
def test_hf_fixtures_greedy_equals_transformers(hf_fixtures, tmp_path, capsys, name, mode):
    ref = np.load(hf_fixtures / f"{name}_ref.npz")
    prompt = ref["prompt"][0].tolist()
    new = ref["greedy"].shape[1] - len(prompt)
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"id": "fixture", "prompt_ids": prompt}) + "\n" +
                   json.dumps({"prompt_ids": list(range(100, 125))}) + "\n")
    out = tmp_path / "out.jsonl"
    rc = main(["generate", str(hf_fixtures / name), "--input", str(inp), "--output", str(out), "--max-new-tokens",
               str(new), "--ignore-eos", "--mode", mode])
    assert rc == 0
    rows = read_jsonl(out)
    assert rows[0]["id"] == "fixture" and rows[0]["completion_ids"] == ref["greedy"][0, len(prompt):].tolist()
    assert rows[0]["prompt_ids"] == prompt and rows[0]["completion"] is None and rows[0]["prompt"] is None
    assert (rows[0]["prompt_tokens"], rows[0]["completion_tokens"], rows[0]["finish_reason"]) == (6, new, "length")
    assert len(rows[1]["completion_ids"]) == new
    err = capsys.readouterr().err
    assert f"2 prompt(s), 31 prompt tokens, {2 * new} generated tokens" in err and "tokens/s" in err
    # the same prompt on the command line, printed
    assert main(["generate", str(hf_fixtures / name), "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens",
                 str(new), "--ignore-eos", "--mode", mode]) == 0
    assert capsys.readouterr().out.split() == [str(t) for t in ref["greedy"][0, len(prompt):]]


def test_checkpoint_with_its_recorded_tokenizer(tiny, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    args = ["generate", tiny["ckpt"], "--prompt", PROMPTS[0], "--prompt", PROMPTS[1], "--max-new-tokens", "12",
            "--output", str(out), "--mode", "pynative"]
    assert main(args) == 0
    rows = read_jsonl(out)
    for prompt, row in zip(PROMPTS, rows):
        ids, text = greedy_text(tiny, prompt, 12)
        assert row["prompt"] == prompt and row["prompt_ids"] == tiny["tok"].encode([prompt])[0]
        assert row["completion_ids"] == ids and row["completion"] == text
    assert "tokens/s" in capsys.readouterr().err
    assert main(["generate", tiny["ckpt"], "--prompt", PROMPTS[0], "--max-new-tokens", "12", "--mode", "pynative"]) == 0
    assert capsys.readouterr().out == PROMPTS[0] + greedy_text(tiny, PROMPTS[0], 12)[1] + "\n\n"


def test_a_copied_checkpoint_generates_with_the_tokenizer_it_carries(tiny, tmp_path, capsys):
    """The tokenizer travels inside the checkpoint (mf-ckpt assets): copy the run's checkpoint away,
    delete the original tokenizer file, and generate with no --tokenizer."""
    import shutil

    spm = tmp_path / "gone" / "spm.model"
    spm.parent.mkdir()
    shutil.copy(tiny["spm"], spm)
    train = {"output_dir": "output/tiny", "tokenizer": {"path": str(spm)}}
    saved = tmp_path / "output" / "tiny" / "checkpoint"
    mf_ckpt.save(str(saved), 5, mf_models.model_state(tiny["model"]),
                 common={"step": 5, "hf_config": tiny["section"], "train_config": train},
                 assets=mf_ckpt.tokenizer_assets(mf_data.tokenizer_files(str(spm))))
    copied = tmp_path / "elsewhere" / "checkpoint"
    shutil.copytree(saved, copied)
    shutil.rmtree(spm.parent)
    assert main(["generate", str(copied), "--prompt", PROMPTS[0], "--max-new-tokens", "12", "--mode", "pynative"]) == 0
    out, err = capsys.readouterr()
    assert out == PROMPTS[0] + greedy_text(tiny, PROMPTS[0], 12)[1] + "\n\n"
    assert "does not exist" not in err


def test_stop_strings_cut_the_text(tiny, tmp_path):
    ids, text = greedy_text(tiny, PROMPTS[1], 24, stop_at_eos=False)
    assert len(text) > 8, text
    stop = text[4:7]
    out = tmp_path / "stop.jsonl"
    assert main(["generate", tiny["ckpt"], "--prompt", PROMPTS[1], "--max-new-tokens", "24", "--ignore-eos",
                 "--stop", stop, "--stop", "\u2603never", "--output", str(out), "--mode", "pynative"]) == 0
    (row,) = read_jsonl(out)
    assert row["completion"] == text[:text.index(stop)] and row["finish_reason"] == "stop"
    assert ids[:len(row["completion_ids"])] == row["completion_ids"]


def write_config(path: Path, tiny, **inference) -> str:
    config = {"run_mode": "predict", "context": {"mode": 1}, "model": tiny["section"],
              "checkpoint": {"load_path": tiny["ckpt"]}, "tokenizer": {"path": tiny["spm"]},
              "training": {"seed": 7}, "inference": {"prompts": PROMPTS, "max_new_tokens": 10, **inference}}
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return str(path)


def test_predict_config_follows_its_inference_section(tiny, tmp_path):
    out = tmp_path / "pred.jsonl"
    config = write_config(tmp_path / "predict.yaml", tiny, output_file=str(out), batch_size=1)
    assert main(["generate", config]) == 0
    rows = read_jsonl(out)
    assert [r["completion"] for r in rows] == [greedy_text(tiny, p, 10)[1] for p in PROMPTS]
    # flags override the YAML's keys; sampling is seeded by training.seed (prompt i: seed + i)
    sampled = write_config(tmp_path / "sample.yaml", tiny, output_file=str(out), do_sample=True, temperature=1.5,
                           top_k=40, top_p=0.95, batch_size=2)
    assert main(["generate", sampled, "--max-new-tokens", "6", "--force"]) == 0
    first = read_jsonl(out)
    assert all(r["completion_tokens"] <= 6 for r in first)
    assert main(["generate", sampled, "--max-new-tokens", "6", "--force"]) == 0
    assert read_jsonl(out) == first
    assert main(["generate", sampled, "--max-new-tokens", "6", "--seed", "8", "--force"]) == 0
    assert read_jsonl(out) != first
    engine = mf_models.InferenceEngine(tiny["model"], max_slots=1, max_len=40, eos_token_ids=[tiny["tok"].eod])
    params = mf_models.SamplingParams(max_new_tokens=6, do_sample=True, temperature=1.5, top_k=40, top_p=0.95, seed=9)
    expected = engine.generate([first[1]["prompt_ids"]], params)[0].output_ids
    assert read_jsonl(out)[1]["completion_ids"] == expected  # prompt 1 of --seed 8


BAD = [
    (["generate", "/no/such/dir", "--prompt", "x"], "/no/such/dir: no such file or directory"),
    (["generate", "{hf}", "--prompt", "hello"], "no tokenizer found for text prompts"),
    (["generate", "{hf}", "--prompt-ids", "1,2", "--do-sample", "--temperature", "0"], "temperature: must be"),
    (["generate", "{hf}", "--prompt-ids", "1,2", "--max-new-tokens", "0"], "max_new_tokens: must be"),
    (["generate", "{hf}", "--prompt-ids", "1,2", "--top-k", "5", "--seed", "1"], "--top-k, --seed: greedy decoding"),
    (["generate", "{config}", "--temperature", "0.5"], "add --do-sample (or set inference.do_sample: true)"),
    (["generate", "{hf}", "--prompt-ids", "1,2", "--batch-size", "0"], "--batch-size: must be at least 1"),
    (["generate", "{hf}", "--prompt-ids", "1,2", "--max-new-tokens", "1000"], "exceeds the model's max_position"),
    (["generate", "{hf}", "--prompt-ids", "1,2", "--stop", "x"], "--stop: stop strings need a tokenizer"),
    (["generate", "{hf}", "--prompt-ids", "1,2", "--output", "/no/such/dir/out.jsonl"], "does not exist"),
    (["generate", "{hf}", "--prompt-ids", "1,2", "--set", "a=1"], "--set applies to a YAML config"),
    (["generate", "{hf}", "--prompt-ids", "1,9999"], "outside the vocabulary"),
    (["generate", "{hf}", "--input", "{bad_jsonl}"], "bad.jsonl:2: expected"),
    (["generate", "{hf}"], "no prompts"),
    # a training YAML means its run's weights: none there yet
    (["generate", "{train_yaml}", "--set", "checkpoint.save_path={tmp}/no_ckpt"],
     "checkpoint.save_path {tmp}/no_ckpt holds no checkpoint yet (a training YAML is read with the weights its run"),
    (["generate", "{eval_yaml}"], "'eval' evaluates: run it with `mf eval CONFIG`"),
    (["generate", "{config}", "--prompt-ids", "1,2"], "--prompt-ids: with a CONFIG"),
    (["generate", "{config}", "--top-p", "2"], "inference.top_p"),
    (["generate", "{no_load}"], "checkpoint.load_path: run_mode predict needs the weights"),
    # outputs: an existing file needs --force, an input is never overwritten
    (["generate", "{hf}", "--prompt-ids", "1,2", "--output", "{existing}"], "--output: {existing} exists; pass --force"),
    (["generate", "{hf}", "--input", "{good_jsonl}", "--output", "{good_jsonl}"], "is also an input"),
    (["generate", "{hf}", "--input", "{good_jsonl}", "--output", "{good_jsonl}", "--force"], "is also an input"),
    (["generate", "{config}", "--output", "{config}", "--force"], "is also an input"),
    # argparse: one line naming the sub-command, and negative ids are values, not options
    (["generate", "{hf}", "--max-new-tokens", "abc"], "argument --max-new-tokens: invalid int value: 'abc' (see 'mf generate --help')"),
    (["generate", "{hf}", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["generate", "{hf}", "--prompt-ids"], "argument --prompt-ids: expected one argument"),
    (["generate", "{hf}", "--prompt-ids", "-1,2"], "--prompt-ids: token id -1 is outside the vocabulary [0, 600)"),
]


@pytest.mark.parametrize("argv,message", BAD, ids=[m[:24] for _, m in BAD])
def test_bad_input_is_one_line_and_exit_2(hf_fixtures, tiny, tmp_path, capsys, argv, message):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_ids": [1, 2]}\n{"text": "x"}\n')
    config = write_config(tmp_path / "predict.yaml", tiny, output_file=str(tmp_path / "never.jsonl"))
    no_load = tmp_path / "no_load.yaml"
    no_load.write_text(Path(config).read_text().replace(f"load_path: {tiny['ckpt']}", "load_path: ''"))
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt_ids": [1, 2]}\n')
    existing = tmp_path / "existing.jsonl"
    existing.write_text("keep me\n")
    values = {"hf": str(hf_fixtures / "llama"), "bad_jsonl": str(bad), "config": config, "train_yaml": str(REPO / "examples" / "tiny" / "train.yaml"),
              "no_load": str(no_load), "good_jsonl": str(good), "existing": str(existing), "tmp": str(tmp_path),
              "eval_yaml": str(REPO / "examples" / "tiny" / "eval.yaml")}
    capsys.readouterr()
    assert main([a.format(**values) for a in argv]) == 2
    assert message.format(**values) in one_error_line(capsys)
    assert not (tmp_path / "never.jsonl").exists()
    assert existing.read_text() == "keep me\n" and good.read_text() == '{"prompt_ids": [1, 2]}\n'
    assert Path(config).read_text().startswith("checkpoint:")


def test_failure_while_generating_exits_1(tiny, tmp_path, monkeypatch, capsys):
    def broken(self):
        raise RuntimeError("kernel launch failed\nmore detail")

    monkeypatch.setattr(mf_models.InferenceEngine, "step", broken)
    out = tmp_path / "out.jsonl"
    assert main(["generate", tiny["ckpt"], "--prompt", "x", "--output", str(out), "--mode", "pynative"]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == "mf generate: generation failed: kernel launch failed"
    assert not out.exists()
