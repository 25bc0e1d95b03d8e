"""mf-models: model registry and definitions (llama, qwen2, qwen3, deepseek_v3, mixtral, qwen3_moe), HF loading
and generation.

    model = mf_models.build_model({"model_type": "qwen3", "hidden_size": 256, ...}, seed=0)
    logits = model(input_ids)                       # [B, S, V] float32
    logits, aux_loss, tokens_per_expert, dispatch_counts = model.forward_train(input_ids)   # training forward
    mf_models.update_expert_bias(model, step_tokens_per_expert)    # DeepSeek's aux-loss-free balancing
    model = mf_models.load_hf("path/to/hf_dir")     # config.json + safetensors via mf-ckpt
    out = mf_models.generate(model, prompt, max_new_tokens=20)
    mf_models.parallelize_model(model, mf_parallel.init_mesh(dims), mf_models.ParallelOptions())  # TP/SP, FSDP
    stage = mf_models.pipeline_stage(model, layout, pp_rank)   # a pipeline rank's chunks (common/pipeline.py)
    adapted = mf_models.apply_lora(model, ".*w[qv]", rank=8, alpha=16.0)   # LoRA adapters (mf_models.lora)
    engine = mf_models.InferenceEngine(model, max_slots=8)   # continuous batching (mf_models.inference)
    done = engine.generate([[1, 5, 9], [1, 7]], mf_models.SamplingParams(max_new_tokens=32))

Importing the package is cheap (no MindSpore): the registry, the argument classes and the errors
load at once, everything else on first use (PEP 562), so checking a config costs milliseconds.

The OpenAI-compatible HTTP server is `mf_models.serving` (extra `serve`: starlette, uvicorn).
"""

__version__ = "0.9.0"

from .common.args import BaseArgs
from .common.inventory import ParamEntry, moe_activations, parameter_inventory, saved_activations
from .common.layout import tensor_parallel_problems
from .common.module_names import (
    LAYER_MODULE_ALIASES,
    layer_module_path,
    layer_modules,
    module_in_layer,
    resolve_layer_module,
)
from .deepseek_v3.args import DeepseekV3Args
from .errors import ModelConfigError, ModelStateError
from .llama.args import LlamaArgs
from .mixtral.args import MixtralArgs
from .qwen2.args import Qwen2Args
from .qwen3.args import Qwen3Args
from .qwen3_moe.args import Qwen3MoeArgs
from .registry import (
    ModelSpec,
    available_models,
    build_args,
    build_model,
    parallelize_model,
    register_model,
    resolve_spec,
)

__all__ = [
    "__version__",
    "BaseArgs", "CausalLM", "InferenceEngine", "KVCache", "ModelConfigError", "ModelSpec", "ModelStateError",
    "LlamaArgs", "LlamaForCausalLM", "Qwen3Args", "Qwen3ForCausalLM", "DeepseekV3Args", "DeepseekV3ForCausalLM",
    "Qwen2Args", "Qwen2ForCausalLM", "MixtralArgs", "MixtralForCausalLM", "Qwen3MoeArgs", "Qwen3MoeForCausalLM",
    "RoutingStats", "update_expert_bias",
    "available_models", "build_args", "build_model", "check_weights_fit", "generate", "init_weights", "load_hf",
    "load_state",
    "load_pretrained", "load_weights", "model_state", "register_model", "resolve_spec", "SamplingParams",
    "tiny_model_section", "LoraLinear", "adapter_state", "apply_lora", "describe_lora_modules", "linear_modules",
    "load_adapter_state", "lora_modules",
    "ParallelOptions", "parallelize_model", "tensor_parallel_problems", "RECOMPUTE_COMM_MODULES",
    "recompute_comm_module", "LAYER_MODULE_ALIASES", "layer_module_path",
    "ParamEntry", "parameter_inventory", "saved_activations", "moe_activations",
    "layer_modules", "module_in_layer", "resolve_layer_module",
    "PipelineChunk", "PipelineStage", "pipeline_stage",
]

# name -> (module, attribute): the parts that need MindSpore, imported on first use.
_LAZY = {
    "KVCache": ("common.attention", "KVCache"),
    "ParallelOptions": ("common.parallel", "ParallelOptions"),
    "RECOMPUTE_COMM_MODULES": ("common.recompute_comm", "RECOMPUTE_COMM_MODULES"),
    "recompute_comm_module": ("common.recompute_comm", "recompute_comm_module"),
    "CausalLM": ("common.transformer", "CausalLM"),
    "init_weights": ("common.transformer", "init_weights"),
    "DeepseekV3ForCausalLM": ("deepseek_v3.model", "DeepseekV3ForCausalLM"),
    "LlamaForCausalLM": ("llama.model", "LlamaForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3.model", "Qwen3ForCausalLM"),
    "Qwen2ForCausalLM": ("qwen2.model", "Qwen2ForCausalLM"),
    "MixtralForCausalLM": ("mixtral.model", "MixtralForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe.model", "Qwen3MoeForCausalLM"),
    "RoutingStats": ("common.balancing", "RoutingStats"),
    "update_expert_bias": ("common.balancing", "update_expert_bias"),
    "generate": ("generation", "generate"),
    "InferenceEngine": ("inference", "InferenceEngine"),
    "SamplingParams": ("inference", "SamplingParams"),
    "load_pretrained": ("inference", "load_pretrained"),
    **{name: ("lora", name) for name in ("LoraLinear", "adapter_state", "apply_lora", "linear_modules",
                                         "load_adapter_state", "lora_modules")},
    "describe_lora_modules": ("lora", "describe_modules"),
    "tiny_model_section": ("presets", "tiny_model_section"),
    **{name: ("state", name) for name in ("load_hf", "load_state", "model_state")},
    "load_weights": ("weights", "load_weights"),
    "check_weights_fit": ("weights", "check_weights_fit"),
    **{name: ("common.pipeline", name) for name in ("PipelineChunk", "PipelineStage", "pipeline_stage")},
}


def __getattr__(name: str):
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'mf_models' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"mf_models.{target[0]}"), target[1])
    globals()[name] = value
    return value
