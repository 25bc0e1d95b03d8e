"""mf-models: model registry and definitions (llama, qwen2, qwen3, deepseek_v3, mixtral, qwen3_moe, gpt2, glm,
glm4, qwen2_moe, glm4_moe), HF loading and generation.

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

Importing the package is cheap (no MindSpore): the registry, the argument classes, the inventory and
the errors load at once; the names under `TYPE_CHECKING` below (MindSpore's) load on first use
(PEP 562, `_LAZY`), so checking a config costs milliseconds. Readers and type checkers see every
name where it comes from.

The OpenAI-compatible HTTP server is `mf_models.serving` (extra `serve`: starlette, uvicorn).
"""

__version__ = "0.9.0"

from typing import TYPE_CHECKING

from .common.args import BaseArgs
from .common.inventory import DecoderInventory, ParamEntry, moe_activations
from .common.layout import tensor_parallel_problems
from .common.module_names import (
    LAYER_MODULE_ALIASES,
    layer_module_path,
    layer_modules,
    module_in_layer,
    resolve_layer_module,
)
from .common.recompute_comm import RECOMPUTE_COMM_MODULES, recompute_comm_module
from .deepseek_v3.args import DeepseekV3Args
from .errors import ModelConfigError, ModelStateError
from .llama.args import LlamaArgs
from .mixtral.args import MixtralArgs
from .presets import tiny_model_section
from .qwen2.args import Qwen2Args
from .qwen3.args import Qwen3Args
from .qwen3_moe.args import Qwen3MoeArgs
from .registry import (
    ModelSpec,
    available_models,
    build_args,
    build_model,
    parallelize_model,
    parameter_inventory,
    register_model,
    resolve_spec,
    saved_activations,
    spec_for_args,
)

if TYPE_CHECKING:  # MindSpore's names: imported on first use at run time (`_LAZY`, the same table)
    from .common.attention import KVCache
    from .common.balancing import RoutingStats, update_expert_bias
    from .common.mtp import shift_left
    from .common.parallel import ParallelOptions
    from .common.pipeline import PipelineChunk, PipelineStage, pipeline_stage
    from .common.transformer import CausalLM, init_weights
    from .deepseek_v3.model import DeepseekV3ForCausalLM
    from .generation import generate
    from .inference import InferenceEngine, SamplingParams, load_pretrained
    from .llama.model import LlamaForCausalLM
    from .lora import LoraLinear, adapter_state, apply_lora, linear_modules, load_adapter_state, lora_modules
    from .lora import describe_modules as describe_lora_modules
    from .mixtral.model import MixtralForCausalLM
    from .qwen2.model import Qwen2ForCausalLM
    from .qwen3.model import Qwen3ForCausalLM
    from .qwen3_moe.model import Qwen3MoeForCausalLM
    from .state import load_hf, load_state, model_state
    from .weights import check_weights_fit, load_weights

__all__ = [
    "__version__",
    # registry, arguments, inventory (no MindSpore)
    "BaseArgs", "ModelConfigError", "ModelSpec", "ModelStateError", "available_models", "build_args", "build_model",
    "parallelize_model", "register_model", "resolve_spec", "spec_for_args", "tiny_model_section",
    "DecoderInventory", "ParamEntry", "parameter_inventory", "saved_activations", "moe_activations",
    "tensor_parallel_problems", "RECOMPUTE_COMM_MODULES", "recompute_comm_module", "LAYER_MODULE_ALIASES",
    "layer_module_path", "layer_modules", "module_in_layer", "resolve_layer_module",
    "LlamaArgs", "Qwen3Args", "DeepseekV3Args", "Qwen2Args", "MixtralArgs", "Qwen3MoeArgs",
    # MindSpore (lazy)
    "CausalLM", "init_weights", "KVCache", "ParallelOptions", "RoutingStats", "update_expert_bias",
    "PipelineChunk", "PipelineStage", "pipeline_stage",
    "LlamaForCausalLM", "Qwen3ForCausalLM", "DeepseekV3ForCausalLM", "Qwen2ForCausalLM", "MixtralForCausalLM",
    "Qwen3MoeForCausalLM", "shift_left",
    "generate", "InferenceEngine", "SamplingParams", "load_pretrained",
    "LoraLinear", "adapter_state", "apply_lora", "describe_lora_modules", "linear_modules", "load_adapter_state",
    "lora_modules",
    "load_hf", "load_state", "model_state", "check_weights_fit", "load_weights",
]

# name -> (module, attribute): the TYPE_CHECKING imports above, for run time (tests/test_package.py
# checks that the two say the same).
_LAZY = {
    "KVCache": ("common.attention", "KVCache"),
    "RoutingStats": ("common.balancing", "RoutingStats"),
    "update_expert_bias": ("common.balancing", "update_expert_bias"),
    "ParallelOptions": ("common.parallel", "ParallelOptions"),
    **{name: ("common.pipeline", name) for name in ("PipelineChunk", "PipelineStage", "pipeline_stage")},
    "CausalLM": ("common.transformer", "CausalLM"),
    "init_weights": ("common.transformer", "init_weights"),
    "DeepseekV3ForCausalLM": ("deepseek_v3.model", "DeepseekV3ForCausalLM"),
    "generate": ("generation", "generate"),
    **{name: ("inference", name) for name in ("InferenceEngine", "SamplingParams", "load_pretrained")},
    "LlamaForCausalLM": ("llama.model", "LlamaForCausalLM"),
    **{name: ("lora", name) for name in ("LoraLinear", "adapter_state", "apply_lora", "linear_modules",
                                         "load_adapter_state", "lora_modules")},
    "describe_lora_modules": ("lora", "describe_modules"),
    "MixtralForCausalLM": ("mixtral.model", "MixtralForCausalLM"),
    "Qwen2ForCausalLM": ("qwen2.model", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3.model", "Qwen3ForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe.model", "Qwen3MoeForCausalLM"),
    "shift_left": ("common.mtp", "shift_left"),  # multi-token prediction's shifted ids / labels / masks
    **{name: ("state", name) for name in ("load_hf", "load_state", "model_state")},
    **{name: ("weights", name) for name in ("check_weights_fit", "load_weights")},
}


def __getattr__(name: str):
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'mf_models' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"mf_models.{target[0]}"), target[1])
    globals()[name] = value
    return value
