"""The Hugging Face side of test_zoo_models.py, run in the hf_interop venv (torch, transformers; no
mf package): random-weight checkpoints of issue 30's architectures made and run by transformers
itself, as the shared fixtures were made, and DeepSeek-V3 / GLM-4.5's MTP layer run by
transformers' MtpModel. Prints one JSON line.

    python zoo_side.py make OUT_DIR '{"config": {...}, "seed": 3, "batch": 2, "seq": 12, "new": 6}'
    python zoo_side.py mtp HF_DIR '{"ids": [[...]]}'
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM


def make(out_dir: str, args: dict) -> dict:
    """Build the config's model with seeded random weights, save it (config + safetensors) and the
    reference logits of random ids and greedy tokens of a random prompt (`ref.npz`)."""
    torch.manual_seed(args["seed"])
    config = AutoConfig.for_model(**args["config"])
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    # transformers initialises some tensors to zero or one (norms, biases, the router's bias):
    # random values everywhere make the comparison see every tensor
    with torch.no_grad():
        for name, tensor in list(model.state_dict(keep_vars=True).items()):
            if tensor.dtype.is_floating_point:
                tensor.copy_(torch.randn_like(tensor) * (0.02 if tensor.ndim > 1 else 0.1)
                             + (1.0 if name.endswith("norm.weight") or "ln_" in name and name.endswith(".weight") else 0.0))
    model.save_pretrained(out_dir)
    rng = np.random.default_rng(args["seed"])
    vocab = config.vocab_size
    ids = torch.tensor(rng.integers(0, vocab, (args["batch"], args["seq"])))
    prompt = torch.tensor(rng.integers(2, vocab, (1, 5)))        # no pad or eos id in the prompt
    with torch.no_grad():
        logits = model(ids).logits.float().numpy()
        greedy = model.generate(prompt, max_new_tokens=args["new"], do_sample=False, min_new_tokens=args["new"],
                                eos_token_id=None, pad_token_id=0).numpy()
    np.savez(f"{out_dir}/ref.npz", input_ids=ids.numpy(), logits=logits, prompt=prompt.numpy(), greedy=greedy)
    return {"model_class": type(model).__name__, "params": int(sum(p.numel() for p in model.parameters()))}


def mtp(hf_dir: str, args: dict) -> dict:
    """transformers' MtpModel on the checkpoint's MTP layer: the depth-1 logits of `ids` (the main
    model's last hidden states, the ids shifted left once, as Megatron / mf train it)."""
    from transformers.modeling_layers import MtpModel

    main = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    # transformers finds the MTP layer by the layer number of the released checkpoints (DeepSeek-V3's
    # 61, GLM-4.5's 46 / 92); these tiny checkpoints store it after their own last layer
    main._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{main.config.num_hidden_layers}\..*"]
    mtp_model = MtpModel.from_pretrained(main).eval()
    ids = torch.tensor(args["ids"])
    shifted = torch.cat([ids[:, 1:], torch.zeros_like(ids[:, :1])], 1)
    positions = torch.arange(ids.shape[1])[None].expand_as(ids)
    with torch.no_grad():
        h = main.model(ids, output_hidden_states=True).last_hidden_state
        h1 = mtp_model.forward_layer(0, h, positions, None, input_ids=shifted)
        logits = mtp_model._project_to_logits(h1).float().numpy()
    return {"logits": logits.tolist()}


if __name__ == "__main__":
    command, path, payload = sys.argv[1:]
    print(json.dumps({"make": make, "mtp": mtp}[command](path, json.loads(payload))))
