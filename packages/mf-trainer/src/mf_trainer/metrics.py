"""What a step costs: the FLOPs it spends, the device's peak FLOP/s (for MFU) and host memory.

MFU = (model FLOPs per step / step time) / peak FLOP/s of the devices used. Model FLOPs per token
(`training_flops_per_token`) are mf-models' `num_flops_per_token(seq_len)` (PaLM, appendix B: 6 x
active matmul parameters N plus the attention term) when every weight trains: per weight and
token, 2 FLOPs forward, 2 for the input gradient and 2 for the weight gradient. A LoRA run freezes
every base weight, so their weight-gradient GEMMs are never computed: 4 N, plus 6 per adapter
weight (forward, input and weight gradients of A and B), plus the attention term. (The first
layer's input gradients, which nothing frozen below needs, are still counted: a 1/layers share of
2 N.) The Trainer multiplies by the tokens of the global batch.

Peak per device: `monitor.peak_flops_per_device` when given; on Ascend a table of known parts;
on CPU a float32 numpy GEMM timed in this process (its BLAS threads, its environment) for a
fraction of a second at start, and the best rate ever seen kept under `$MF_CACHE_DIR` (default
`~/.cache/mf`) keyed by CPU model and thread count; so MFU on CPU is relative to the GEMM rate
this process can reach, and a measurement taken on a busy machine does not stick.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

import numpy as np

# Dense fp16/bf16 peak per device, FLOP/s (vendor figures). Used when no peak is configured.
ASCEND_PEAK_FLOPS: dict[str, float] = {
    "Ascend910A": 256e12,
    "Ascend910B1": 414e12,
    "Ascend910B2": 376e12,
    "Ascend910B3": 313e12,
    "Ascend910B4": 280e12,
}


def _cache_dir() -> Path:
    return Path(os.environ.get("MF_CACHE_DIR") or Path.home() / ".cache" / "mf")


def _cpu_key() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return f"{model} x{threads}"


def measure_cpu_gemm_flops(n: int = 1536, seconds: float = 0.5) -> float:
    """Float32 GEMM FLOP/s of this process (numpy's BLAS), best of a short series of n x n products."""
    rng = np.random.default_rng(0)
    a = rng.random((n, n), dtype=np.float32)
    b = rng.random((n, n), dtype=np.float32)
    a @ b  # warm-up: thread pool start, page faults
    best = 0.0
    deadline = time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter()
        a @ b
        dt = time.perf_counter() - t0
        best = max(best, 2.0 * n ** 3 / dt)
        if time.perf_counter() > deadline:
            return best


def _store_cpu_peak(peak: float) -> str:
    """Keep `peak` as the best measured for this CPU; returns the cache's path (for the log)."""
    key, path = _cpu_key(), _cache_dir() / "peak_flops.json"
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    if not isinstance(cache, dict):
        cache = {}
    if not (isinstance(cache.get(key), (int, float)) and cache[key] >= peak):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            cache[key] = peak
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(cache, indent=1))
            os.replace(tmp, path)
        except OSError:
            pass  # an unwritable cache only costs a re-measurement next run
    return str(path)


def raise_cpu_peak(achieved: float) -> str:
    """A training step reached `achieved` FLOP/s per rank, above the measured CPU peak: the peak
    measurement read low (a busy machine), and what a step reaches is itself a floor of what the
    CPU can do. Keep it as the best measured; returns the cache's path."""
    return _store_cpu_peak(achieved)


def cpu_peak_flops() -> tuple[float, str]:
    """(peak FLOP/s, where it came from): the best of this run's short measurement and the best
    cached for this CPU. A single measurement on a busy machine reads low; keeping the best seen
    makes the figure converge on what the CPU can do."""
    key = _cpu_key()
    path = _cache_dir() / "peak_flops.json"
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    cached = float(cache[key]) if isinstance(cache.get(key), (int, float)) and cache[key] > 0 else 0.0
    measured = measure_cpu_gemm_flops(seconds=0.3 if cached else 0.5)
    if cached >= measured:
        return cached, f"best measured so far for {key} ({path})"
    _store_cpu_peak(measured)
    return measured, f"measured now for {key}"



def training_flops_per_token(model, seq_len: int) -> int:
    """FLOPs one training step spends per token (see the module docstring)."""
    import mf_models

    full = model.num_flops_per_token(seq_len)
    adapters = mf_models.adapter_state(model)
    if not adapters:
        return full
    adapter_weights = sum(int(v.size) for v in adapters.values())
    base_trains = any(p.name not in adapters for p in model.trainable_params())
    if base_trains:                  # adapters on a model that trains whole (not mf's LoRA)
        return full + 6 * adapter_weights
    return full - 2 * model.active_matmul_params() + 6 * adapter_weights


def peak_flops_per_device(device_target: str, configured: float | None) -> tuple[float | None, str]:
    """The peak used for MFU, and a phrase saying where it came from (logged once)."""
    if configured:
        return float(configured), "monitor.peak_flops_per_device"
    if device_target == "CPU":
        return cpu_peak_flops()
    if device_target == "Ascend":
        try:
            import mindspore as ms

            name = ms.hal.get_device_name("Ascend", 0) if hasattr(ms, "hal") else ""
        except Exception:  # the device query is best effort; MFU is then reported as unknown
            name = ""
        for part, peak in ASCEND_PEAK_FLOPS.items():
            if name.startswith(part):
                return peak, f"table entry {part}"
        return None, f"unknown Ascend part {name!r}: set monitor.peak_flops_per_device"
    return None, f"no peak known for {device_target}: set monitor.peak_flops_per_device"


def host_rss_bytes() -> int:
    """Resident set size of this process now (Linux /proc), else its peak (getrusage)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024
