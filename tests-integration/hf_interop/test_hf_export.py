"""An HF export of a run, read by transformers itself (issue 11's "done when", issue 31's versions):
`mf train` a tiny llama on the demo corpus, `mf generate` greedily from its checkpoint, `mf ckpt
convert --to hf`, then, in a venv holding torch + transformers + peft and no mf package,
`AutoTokenizer`, `AutoModelForCausalLM`, `GenerationConfig` and `generate` on the export: the same
prompt ids, the same greedy tokens and the same text as `mf generate`, for ordinary text, unicode,
digits, leading spaces and newlines. A LoRA adapter exported to PEFT's layout loads with
`PeftModel.from_pretrained` and gives the logits of `mf ckpt merge-lora --to hf`.

Each test runs against every venv of `MF_HF_PYTHONS` (os.pathsep-separated pythons; the nox session
`hf_interop` builds one per transformers version: 4.57.x, 5.23.0, the newest 5.x; `MF_HF_PYTHON`,
one python, is read too); without any the tests are skipped with that reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
HF_PYTHONS = [p for p in (os.environ.get("MF_HF_PYTHONS") or os.environ.get("MF_HF_PYTHON") or "").split(os.pathsep)
              if p and os.access(p, os.X_OK)]
pytestmark = pytest.mark.skipif(not HF_PYTHONS, reason="MF_HF_PYTHONS (pythons with torch, transformers and peft) "
                                                       "is not set: run `./bootstrap nox -s hf_interop`")

TRAIN = """\
output_dir: out/tiny
context: {mode: 1}
checkpoint: {save_interleaved_steps: 4, save_max: 1}
training: {steps: 4, local_batch_size: 2, global_batch_size: 2, seed: 3}
optimizer: {type: AdamW}
lr_scheduler: {type: CosineWithWarmUpLR, learning_rate: 3.e-3, warmup_steps: 1, lr_end: 1.e-4}
train_dataset:
  dataloader:
    type: BlendedMegatronDatasetDataLoader
    datasets_type: GPTDataset
    sizes: [8, 0, 0]
    column_names: [input_ids, labels, loss_mask, position_ids]
    config: {seq_length: 32, split: "1,0,0", seed: 1, eod: 2, pad: 0, create_attention_mask: False,
             data_path: ["1", "cache/pydoc_text_document"]}
    demo_corpus: {vocab_size: 300}
  num_parallel_workers: 1
tokenizer: {path: cache/pydoc_spm.model}
model: {model_type: llama, vocab_size: 300, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2,
        num_attention_heads: 2, max_position_embeddings: 64, seq_length: 32, initializer_range: 0.3}
"""
PROMPTS = ["The for statement", "Classes provide a means", "ünïcödé café, 日本語 🙂", "digits 12345 and 0.5",
           "  two leading spaces", "first line\nsecond line\n\nthird", "\nafter a newline"]
NEW = 10


def mf(cwd, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "mf_cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "GLOG_v": "3"}, timeout=900)
    assert done.returncode == 0, f"mf {' '.join(args)}: {done.stderr[-2000:]}"
    return done


def hf(python: str, *args: str) -> dict:
    done = subprocess.run([python, str(HERE / "hf_side.py"), *args], capture_output=True, text=True, timeout=900,
                          env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(params=HF_PYTHONS or [None], ids=lambda p: Path(p).parent.parent.name if p else "none")
def hf_python(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_interop")
    (root / "train.yaml").write_text(TRAIN)
    mf(root, "train", "train.yaml")
    return root


@pytest.fixture(scope="module")
def exported(run, tmp_path_factory):
    """`mf generate` on the run's checkpoint copied away from its training directory (everything
    comes from inside it), and its HF export."""
    root = tmp_path_factory.mktemp("export")
    ckpt = root / "copied"
    subprocess.run(["cp", "-r", str(run / "out" / "tiny" / "checkpoint"), str(ckpt)], check=True)
    args = [a for p in PROMPTS for a in ("--prompt", p)]
    mf(root, "generate", str(ckpt), *args, "--max-new-tokens", str(NEW), "--mode", "pynative",
       "--output", str(root / "gen.jsonl"))
    ours = [json.loads(line) for line in (root / "gen.jsonl").read_text().splitlines()]
    converted = mf(root, "ckpt", "convert", "--from", "mf", "--to", "hf", str(ckpt), str(root / "hf"))
    assert "tokenizer: tokenizer.json, tokenizer.model, tokenizer_config.json" in converted.stdout
    assert "generation_config.json" in converted.stdout
    return {"ours": ours, "hf": root / "hf", "spm": run / "cache" / "pydoc_spm.model"}


def test_export_generates_in_transformers_as_mf_generate_does(exported, hf_python):
    from mf_data import SentencePieceTokenizer

    sp = SentencePieceTokenizer(str(exported["spm"]))
    theirs = hf(hf_python, "generate", str(exported["hf"]), json.dumps({"prompts": PROMPTS, "max_new_tokens": NEW}))
    print(f"transformers {theirs['transformers']}: {theirs['tokenizer_class']}, {theirs['model_class']}")
    assert theirs["model_class"] == "LlamaForCausalLM"
    assert theirs["tokenizer_class"] in ("PreTrainedTokenizerFast", "TokenizersBackend")   # 5.x: the same class
    eos = theirs["eos_token_id"]
    eos = eos if isinstance(eos, list) else [eos]
    for mine, other in zip(exported["ours"], theirs["rows"], strict=True):
        assert other["prompt_ids"] == mine["prompt_ids"] == sp.encode([mine["prompt"]])[0], mine["prompt"]
        completion = other["completion_ids"]
        if completion and completion[-1] in eos:       # mf leaves the stop token out of completion_ids
            completion = completion[:-1]
        assert completion == mine["completion_ids"], mine["prompt"]
        # the text: sentencepiece's decoding of the prompt, then mf's completion text
        assert other["prompt_text"] == sp.decode(mine["prompt_ids"]), mine["prompt"]
        assert other["text"] == other["prompt_text"] + mine["completion"], mine["prompt"]


@pytest.fixture(scope="module")
def peft_dirs(run, tmp_path_factory):
    """A LoRA adapter trained on the run's checkpoint, exported to PEFT's layout, with the base
    exported and the adapter merged into it (`merge-lora --to hf`)."""
    import yaml

    tmp_path = tmp_path_factory.mktemp("peft")
    base = run / "out" / "tiny" / "checkpoint"
    cfg = yaml.safe_load(TRAIN)
    cfg["run_mode"] = "finetune"
    cfg["output_dir"] = str(tmp_path / "out" / "lora")
    cfg["checkpoint"] = {"load_path": str(base), "save_interleaved_steps": 4, "save_max": 1}
    cfg["tokenizer"]["path"] = str(run / "cache" / "pydoc_spm.model")
    cfg["train_dataset"]["dataloader"]["config"]["data_path"] = ["1", str(run / "cache" / "pydoc_text_document")]
    # lora_dropout 0: deterministic; B starts at zero, so four steps at 3e-3 make it non-zero
    cfg["lora"] = {"target_modules": ".*wq|.*wv", "lora_rank": 4, "lora_alpha": 8.0, "lora_dropout": 0.0}
    (tmp_path / "lora.yaml").write_text(yaml.safe_dump(cfg))
    mf(tmp_path, "train", "lora.yaml")
    adapter = tmp_path / "out" / "lora" / "checkpoint"
    mf(tmp_path, "ckpt", "convert", "--from", "mf", "--to", "hf", str(base), str(tmp_path / "base_hf"))
    mf(tmp_path, "ckpt", "convert", "--from", "mf", "--to", "hf", str(adapter), str(tmp_path / "peft"))
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8.0
    mf(tmp_path, "ckpt", "merge-lora", str(base), str(adapter), str(tmp_path / "merged"), "--to", "hf")
    return [str(tmp_path / name) for name in ("base_hf", "peft", "merged")]


def test_peft_export_loads_in_peft_with_the_merged_logits(peft_dirs, hf_python):
    result = hf(hf_python, "peft", *peft_dirs, json.dumps({"ids": list(range(5, 25))}))
    assert result["max_abs_diff"] <= 1e-5 * max(1.0, result["max_abs"]), result
