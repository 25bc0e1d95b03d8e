"""The generation benchmarks' shared parts: the 20M llama written as a Hugging Face directory, the
HF transformers `generate` worker that runs in the reference venv, and this machine's memory
bandwidth.

- `write_hf_model(dir)`: mf-models' llama (hidden 256, 4 layers, 4 heads, vocab 32000, untied
  head, ~20M parameters, float32, seed 0) saved by mf-ckpt's `save_hf`. Both sides load this same
  directory: mf through `mf_models.load_hf` / `mf serve`, HF through `AutoModelForCausalLM`.
  No EOS id in its config: every request runs to its token budget on both sides.
- `HFWorker(python, hf_dir)`: a process of the reference venv (torch + transformers) answering
  `{"prompts": [[ids]], "new": n}` with the greedy tokens of `model.generate(...)` (KV cache,
  `do_sample=False`) and its timings: the wall time of the call, and the moment each new token
  was chosen (a logits processor notes the time each step reaches it), so the time per output
  token is measured inside HF's own loop.
- `memory_bandwidth(nbytes)`: GB/s of reading a buffer of `nbytes` over and over with every core
  (numpy in a subprocess), what a decode step does with its weights: the weight-streaming bound
  of a decode step is (bytes it reads) / this.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

HF_MODEL = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 256, "intermediate_size": 704,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
            "max_position_embeddings": 512, "tie_word_embeddings": False, "rms_norm_eps": 1e-6,
            "architectures": ["LlamaForCausalLM"]}


def write_hf_model(hf_dir: str) -> int:
    """Save the benchmark model (seed 0) as a Hugging Face directory; returns its parameter count."""
    import mf_ckpt
    import mf_models

    section = {k: v for k, v in HF_MODEL.items() if k != "architectures"}
    model = mf_models.build_model(section, seed=0)
    state = mf_models.model_state(model)
    mf_ckpt.save_hf(hf_dir, state, HF_MODEL, overwrite=True)
    return sum(int(v.size) for v in state.values())


def decode_step_bytes(params: int, *, vocab: int, hidden: int, layers: int, kv_dim: int, batch: int,
                      attended: int) -> int:
    """Bytes one decode step must read at least: every fp32 weight but the embedding table (of
    which it reads `batch` rows), and the cached keys and values it attends over."""
    weights = params - vocab * hidden
    return 4 * (weights + batch * hidden + batch * layers * 2 * kv_dim * attended)


# --------------------------------------------------------------------------- memory bandwidth
BANDWIDTH_PROBE = """
import sys, time
from concurrent.futures import ThreadPoolExecutor
import numpy as np
nbytes, seconds = int(sys.argv[1]), float(sys.argv[2])
threads = len(__import__("os").sched_getaffinity(0))
data = np.ones(nbytes // 4, np.float32)
parts = np.array_split(data, threads)
pool = ThreadPoolExecutor(threads)
def read(p):
    return float(np.add.reduce(p))   # vectorised sum: one pass over the bytes, nothing written
list(pool.map(read, parts))
best, end = 0.0, time.perf_counter() + seconds
while time.perf_counter() < end:
    t = time.perf_counter()
    list(pool.map(read, parts))
    best = max(best, nbytes / (time.perf_counter() - t))
print(best, threads)
"""


def memory_bandwidth(nbytes: int, seconds: float = 1.5) -> tuple[float, int]:
    """(bytes/s of reading `nbytes` repeatedly on every core this process may use, threads): the
    best pass over `seconds`, in a fresh numpy process."""
    out = subprocess.run([sys.executable, "-c", BANDWIDTH_PROBE, str(nbytes), str(seconds)],
                         capture_output=True, text=True, check=True)
    rate, threads = out.stdout.split()
    return float(rate), int(threads)


# ------------------------------------------------------------------------------ the HF worker
class HFWorker:
    """The reference side in its own process (the reference venv's interpreter)."""

    def __init__(self, python: str, hf_dir: str):
        self.proc = subprocess.Popen([python, __file__, "--worker", hf_dir], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONWARNINGS": "ignore", "TRANSFORMERS_VERBOSITY": "error"})
        line = self.proc.stdout.readline()
        self.info = json.loads(line) if line else {"ready": False, "error": "the worker died"}

    def generate(self, prompts: list[list[int]], new: int) -> dict:
        """{"tokens": [[new ids]] per prompt, "seconds": wall time of generate, "steps": the
        time of each new token's choice, seconds after the call started}."""
        self.proc.stdin.write(json.dumps({"prompts": prompts, "new": new}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def worker_main(hf_dir: str) -> None:
    out = sys.stdout
    sys.stdout = sys.stderr  # library chatter must not corrupt the protocol
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

        model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
        model.generation_config.eos_token_id = None   # run to the budget, as mf's side does
        model.generation_config.pad_token_id = 0
        info = {"ready": True, "torch": torch.__version__, "transformers": transformers.__version__,
                "threads": torch.get_num_threads()}
    except Exception as exc:  # reported to the parent, which prints it
        info = {"ready": False, "error": f"{type(exc).__name__}: {exc}"}
    out.write(json.dumps(info) + "\n")
    out.flush()
    if not info["ready"]:
        return

    class StepClock(LogitsProcessor):
        """Notes when each step's logits reach the processors (its forward is done)."""

        def __init__(self):
            self.times: list[float] = []

        def __call__(self, input_ids, scores):
            self.times.append(time.perf_counter())
            return scores

    for line in sys.stdin:
        request = json.loads(line)
        ids = torch.tensor(request["prompts"], dtype=torch.long)
        clock = StepClock()
        with torch.inference_mode():
            start = time.perf_counter()
            result = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=request["new"],
                                    min_new_tokens=0, do_sample=False, use_cache=True,
                                    logits_processor=LogitsProcessorList([clock]))
            seconds = time.perf_counter() - start
        out.write(json.dumps({"tokens": result[:, ids.shape[1]:].tolist(), "seconds": seconds,
                              "steps": [t - start for t in clock.times]}) + "\n")
        out.flush()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2])
