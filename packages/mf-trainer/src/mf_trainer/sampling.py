"""A text sample at the end of training: `inference.prompts` (or `input_file`) completed by the
trained model with `mf_models.generate`, tokenised with the sentencepiece model at
`tokenizer.path`. Sampling settings come from the `inference` section (max_new_tokens,
do_sample, temperature, top_k, top_p, stop_token_ids, batch_size); the results are logged
(`sample_text`: the prompt and the completion on labelled lines) and, with
`inference.output_file`, written as one JSON object per prompt.
"""

from __future__ import annotations

import json
import logging

import numpy as np

log = logging.getLogger("mf_trainer")


def _prompts(inf) -> list[str]:
    prompts = list(inf.prompts or [])
    if inf.input_file:
        with open(inf.input_file, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    item = json.loads(line)
                except ValueError:
                    item = line
                prompts.append(item.get("prompt", "") if isinstance(item, dict) else str(item))
    return prompts


def _left_pad(rows: list[list[int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad, np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = r
        mask[i, width - len(r):] = 1
    return ids, mask


def sample_text(index: int, count: int, prompt: str, completion: str) -> str:
    """One sample as the console shows it: a header, then the prompt and the completion on lines
    of their own (a multi-line text keeps its lines, each under its label)::

        sample 1/2
          prompt     | The for statement
          completion | is used to iterate over the elements of a sequence
    """
    lines = [f"sample {index}/{count}"]
    for label, text in (("prompt", prompt), ("completion", completion)):
        parts = text.split("\n") if text else [""]
        lines.append(f"  {label:<10} | {parts[0]}")
        lines += [f"  {'':<10} | {part}" for part in parts[1:]]
    return "\n".join(lines)


def generate_samples(model, inf, tokenizer_path: str, seed: int) -> list[dict]:
    import mf_data
    import mf_models

    tokenizer = mf_data.SentencePieceTokenizer(tokenizer_path)
    if tokenizer.vocab_size > model.args.vocab_size:
        raise ValueError(f"tokenizer.path: {tokenizer.vocab_size} pieces exceed model.vocab_size {model.args.vocab_size}")
    eod = tokenizer.eod
    eos = list(inf.stop_token_ids or []) or ([eod] if eod is not None else None)
    pad = eod if eod is not None else 0
    prompts = _prompts(inf)
    results = []
    for start in range(0, len(prompts), inf.batch_size):
        batch = prompts[start:start + inf.batch_size]
        rows = [tokenizer.encode([p])[0] or [pad] for p in batch]
        ids, mask = _left_pad(rows, pad)
        out = mf_models.generate(model, ids, inf.max_new_tokens, do_sample=inf.do_sample,
                                 temperature=inf.temperature, top_k=inf.top_k, top_p=inf.top_p,
                                 eos_token_id=eos, seed=seed, padding_mask=mask, pad_token_id=pad)
        for prompt, row in zip(batch, out[:, ids.shape[1]:].tolist()):
            if eos:
                row = row[: next((i for i, t in enumerate(row) if t in eos), len(row))]
            # A model vocabulary padded beyond the tokenizer's can emit ids it cannot decode.
            row = [t for t in row if t < tokenizer.vocab_size]
            completion = tokenizer.decode(row)
            results.append({"prompt": prompt, "completion": completion})
            log.info(sample_text(len(results), len(prompts), prompt, completion))
    if inf.output_file:
        with open(inf.output_file, "w", encoding="utf-8") as f:
            for row in results:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return results
