"""The Hugging Face side of test_hf_export.py, run in the hf_interop venv (torch, transformers, peft;
no mf package): loads what mf exported exactly as a transformers user would and prints JSON.

    python hf_side.py generate HF_DIR '{"prompts": [...], "max_new_tokens": N}'
    python hf_side.py peft BASE_DIR ADAPTER_DIR MERGED_DIR '{"ids": [...]}'
"""

from __future__ import annotations

import json
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig


def generate(hf_dir: str, args: dict) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    generation = GenerationConfig.from_pretrained(hf_dir)
    eos = generation.eos_token_id if isinstance(generation.eos_token_id, list) else [generation.eos_token_id]
    rows = []
    for prompt in args["prompts"]:
        ids = tokenizer(prompt)["input_ids"]
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=args["max_new_tokens"], do_sample=False,
                                 generation_config=generation)
        new = out[0, len(ids):].tolist()
        shown = new[:-1] if new and new[-1] in eos else new    # the stop token is not text
        # skip_special_tokens=False: the unknown piece stays (as sentencepiece's " ⁇ "), and the
        # tokenizer's own decoder decides what a control piece becomes
        rows.append({"prompt_ids": ids, "completion_ids": new,
                     "prompt_text": tokenizer.decode(ids, skip_special_tokens=False),
                     "text": tokenizer.decode(ids + shown, skip_special_tokens=False)})
    return {"rows": rows, "eos_token_id": generation.eos_token_id, "tokenizer_class": type(tokenizer).__name__,
            "model_class": type(model).__name__, "transformers": transformers.__version__}


def peft_logits(base_dir: str, adapter_dir: str, merged_dir: str, args: dict) -> dict:
    from peft import PeftModel

    ids = torch.tensor([args["ids"]])
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    with torch.no_grad():
        adapted = PeftModel.from_pretrained(base, adapter_dir).eval()(ids).logits[0]
        merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()(ids).logits[0]
    return {"max_abs_diff": float((adapted - merged).abs().max()), "max_abs": float(merged.abs().max()),
            "transformers": transformers.__version__}


if __name__ == "__main__":
    command, *paths, payload = sys.argv[1:]
    fn = {"generate": generate, "peft": peft_logits}[command]
    print(json.dumps(fn(*paths, json.loads(payload))))
