"""mf-models: model registry and definitions (llama, qwen3, deepseek_v3), HF loading and generation.

    model = mf_models.build_model({"model_type": "qwen3", "hidden_size": 256, ...}, seed=0)
    logits = model(input_ids)                       # [B, S, V] float32
    model = mf_models.load_hf("path/to/hf_dir")     # config.json + safetensors via mf-ckpt
    out = mf_models.generate(model, prompt, max_new_tokens=20)
    mf_models.parallelize_model(model, mf_parallel.init_mesh(dims), mf_models.ParallelOptions())  # TP/SP, FSDP
    stage = mf_models.pipeline_stage(model, layout, pp_rank)   # a pipeline rank's chunks (common/pipeline.py)
    adapted = mf_models.apply_lora(model, ".*w[qv]", rank=8, alpha=16.0)   # LoRA adapters (mf_models.lora)
    engine = mf_models.InferenceEngine(model, max_slots=8)   # continuous batching (mf_models.inference)
    done = engine.generate([[1, 5, 9], [1, 7]], mf_models.SamplingParams(max_new_tokens=32))

The OpenAI-compatible HTTP server is `mf_models.serving` (extra `serve`: starlette, uvicorn).
"""

__version__ = "0.5.0"

from .common.args import BaseArgs
from .common.attention import KVCache
from .common.parallel import ParallelOptions
from .common.pipeline import PipelineChunk, PipelineStage, pipeline_stage
from .common.transformer import CausalLM, init_weights
from .deepseek_v3 import DeepseekV3Args, DeepseekV3ForCausalLM
from .errors import ModelConfigError, ModelStateError
from .generation import generate
from .inference import InferenceEngine, SamplingParams, load_pretrained
from .llama import LlamaArgs, LlamaForCausalLM
from .lora import LoraLinear, adapter_state, apply_lora, linear_modules, load_adapter_state, lora_modules
from .lora import describe_modules as describe_lora_modules
from .presets import tiny_model_section
from .qwen3 import Qwen3Args, Qwen3ForCausalLM
from .registry import (
    ModelSpec,
    available_models,
    build_args,
    build_model,
    parallelize_model,
    register_model,
    resolve_spec,
)
from .state import load_hf, load_state, model_state

__all__ = [
    "__version__",
    "BaseArgs", "CausalLM", "InferenceEngine", "KVCache", "ModelConfigError", "ModelSpec", "ModelStateError",
    "LlamaArgs", "LlamaForCausalLM", "Qwen3Args", "Qwen3ForCausalLM", "DeepseekV3Args", "DeepseekV3ForCausalLM",
    "available_models", "build_args", "build_model", "generate", "init_weights", "load_hf", "load_state",
    "load_pretrained", "model_state", "register_model", "resolve_spec", "SamplingParams", "tiny_model_section",
    "LoraLinear", "adapter_state", "apply_lora", "describe_lora_modules", "linear_modules", "load_adapter_state",
    "lora_modules",
    "ParallelOptions", "parallelize_model",
    "PipelineChunk", "PipelineStage", "pipeline_stage",
]
