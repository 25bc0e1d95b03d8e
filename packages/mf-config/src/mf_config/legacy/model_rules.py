"""`model` (`model_config` + `arch`), `moe_config`, LoRA (`pet_config`) and generation settings.

The older format nests hyper-parameters in `model.model_config` under MindFormers' names
(`num_layers`, `num_heads`, `n_kv_heads`, ...); mf's `model` section holds them directly under
Hugging Face names, next to `model_type` / `architectures`. Plain carries (same name, one level
up) get one summary line; renames and derivations get a line each.
"""

from __future__ import annotations

from typing import Any

from mf_config.errors import ConfigError, fmt_value
from mf_config.legacy.model_tables import (
    ARCHITECTURES,
    CONFIG_TYPES,
    MODEL_DEFAULT,
    MODEL_DROPS,
    MODEL_HANDLED_ELSEWHERE,
    MODEL_KEYS,
    MODEL_RENAMES,
    MODEL_TYPES,
    MOE_DEFAULTS,
    MOE_DEFAULTS_BY_FAMILY,
    MOE_DROPS,
    MOE_RENAMES,
    MOE_RENAMES_BY_FAMILY,
)
from mf_config.legacy.session import Migration
from mf_config.legacy.tables import gone, lookup, moot

MC = ("model", "model_config")
_AVAILABLE = ", ".join(f"{t} ({a})" for t, a in MODEL_TYPES.items())


def migrate_model(m: Migration) -> None:
    if not isinstance(m.value(("model",)), dict):
        return  # the engine reports a missing model section
    _identify(m)
    _variant(m)
    _params_dtype(m)
    if m.facts.family == "gpt2":
        _gpt2(m)
    elif m.facts.family == "glm":
        _chatglm(m)
    _hyper_parameters(m)
    _structure_switches(m)
    _intermediate_size(m)
    _rope_scaling(m)
    _multi_token_prediction(m)
    _moe(m)
    _lora(m)
    _generation(m)
    num_layers = m.get_new("model.num_hidden_layers")
    if isinstance(num_layers, int) and not isinstance(num_layers, bool):
        m.facts.num_layers = num_layers


# -- which model ------------------------------------------------------------------------------------
def _identify(m: Migration) -> None:
    arch_path = ("model", "arch", "type")
    arch = m.value(arch_path)
    mc = m.src.mapping(MC)
    declared = mc.get("architectures")
    if isinstance(declared, list) and len(declared) == 1:
        declared = declared[0]
    candidates = [(arch_path, arch), ((*MC, "architectures"), declared)]
    family = architecture = None
    for path, name in candidates:
        if isinstance(name, str) and name in ARCHITECTURES:
            family, architecture = ARCHITECTURES[name]
            m.translated(path, f"model.model_type: {family}, model.architectures: {architecture}")
            break
    named = next((name for _, name in candidates if isinstance(name, str) and name), None)
    if family is None and named is None:
        # no architecture named: the config class says which model (an unknown architecture name
        # is refused below, not migrated as its config class's causal LM: GPT2ForSequenceClassification)
        for path, kind in (((*MC, "model_type"), mc.get("model_type")), ((*MC, "type"), mc.get("type"))):
            name = kind if path[-1] == "model_type" else lookup(CONFIG_TYPES, kind)
            if lookup(MODEL_TYPES, name) is not None:
                family, architecture = name, MODEL_TYPES[name]
                m.translated(path, f"model.model_type: {family}, model.architectures: {architecture}")
                break
    if family is None:
        where = "model.arch.type" if arch == named else "model.model_config.architectures"
        if named is not None:
            raise ConfigError(where, f"{named}: mf has no such model (available: {_AVAILABLE}); the config is "
                                     "refused rather than migrated as a different architecture")
        hf_dir = m.value(("pretrained_model_dir",))
        if isinstance(hf_dir, str) and hf_dir:
            raise ConfigError("model.arch.type", f"not given: MindFormers took the architecture from "
                                                 f"{hf_dir}/config.json, which a migration does not read; refused "
                                                 f"(write model.model_type, one of {', '.join(MODEL_TYPES)}, and the "
                                                 "hyper-parameters of that file by hand)")
        raise ConfigError("model.arch.type", f"names no architecture; mf's models are {_AVAILABLE}")
    m.set("model.model_type", family)
    m.set("model.architectures", architecture)
    m.facts.family = family
    _identity_leftovers(m, family)


def _variant(m: Migration) -> None:
    """MindFormers ran Qwen1.5/2 (q/k/v biases) and Mixtral (experts) through its llama classes, and
    Qwen3-MoE through its qwen3 ones: pick the mf model with the same architecture, or refuse one
    mf does not have (never train a different network than the old file described)."""
    family = m.facts.family
    mc = m.src.mapping(MC)
    moe = m.src.mapping(("moe_config",))
    experts = moe.get("expert_num", 1)
    sparse = isinstance(experts, int) and not isinstance(experts, bool) and experts > 1
    bias = mc.get("qkv_has_bias") is True
    shared = moe.get("shared_expert_num") or 0
    new = family
    if family == "llama" and bias and sparse:
        gated = moe.get("use_shared_expert_gating") is True
        if shared and not gated:
            raise ConfigError("moe_config.use_shared_expert_gating", f"{fmt_value(moe.get('use_shared_expert_gating'))}: "
                                                                     "a llama with q/k/v biases, routed experts and "
                                                                     "ungated shared experts is no model mf has "
                                                                     "(Qwen2-MoE gates its shared expert); refused")
        new = "qwen2_moe"
    elif family in ("llama", "qwen3") and sparse:
        if shared:
            raise ConfigError("moe_config.shared_expert_num", f"{fmt_value(shared)}: shared experts exist only in "
                                                              "mf's deepseek_v3; this architecture is refused")
        new = "mixtral" if family == "llama" else "qwen3_moe"
    elif family == "llama" and bias:
        new = "qwen2"
    if new != family:
        why = ("q/k/v biases on a llama are Qwen1.5/Qwen2" if new == "qwen2"
               else f"q/k/v biases and {experts} routed experts (moe_config) on a llama are Qwen1.5-MoE/Qwen2-MoE"
               if new == "qwen2_moe" else f"{family} with {experts} routed experts (moe_config) is {new}")
        m.set("model.model_type", new)
        m.set("model.architectures", MODEL_TYPES[new])
        m.facts.family = new
        m.line(("model",), "translated", f"model.model_type: {new}, model.architectures: {MODEL_TYPES[new]} "
               f"({why}; MindFormers ran it through its {family} classes)", mark=False)


def _params_dtype(m: Migration) -> None:
    """float16 master weights overflow / underflow without loss scaling (mf has none): a CPU run
    went NaN after one step. Training keeps float32 parameters (compute_dtype still sets the
    matmul precision); a predict config upcasts its weights on load, which loses nothing."""
    path = (*MC, "param_init_type")
    if m.value(path) != "float16" or "params_dtype" in m.src.mapping(MC):
        return
    m.set("model.params_dtype", "float32")
    if m.value(("run_mode",), "train") == "predict":
        m.translated(path, "model.params_dtype: float32 (float16 weights are upcast on load; nothing is lost)")
    else:
        m.action(path, "model.params_dtype: float32 is written instead of float16: float16 master weights without "
                       "loss scaling go non-finite within steps; keep float32 (or set bfloat16 by hand)",
                 fix="model.params_dtype")


def _identity_leftovers(m: Migration, family: str | None) -> None:
    same = f"the model is model.model_type / model.architectures ({family})" if family else "see model.architectures"
    for path in (("model", "arch", "type"), (*MC, "architectures"), (*MC, "model_type"), (*MC, "type")):
        if m.src.has(path) and not m.src.is_handled(path):
            m.unneeded(path, same)
    m.drop_table(("model", "arch"), {"auto_register": moot("a MindFormers class-registration path")})
    m.drop_table(MC, {"auto_register": moot("a MindFormers class-registration path")})


# -- hyper-parameters -----------------------------------------------------------------------------
def _hyper_parameters(m: Migration) -> None:
    family = m.facts.family
    accepted = MODEL_KEYS.get(family) if family else frozenset().union(*MODEL_KEYS.values())
    mc = m.src.mapping(MC)
    carried: list[str] = []
    for key, value in mc.items():
        path = (*MC, key)
        if key in MODEL_HANDLED_ELSEWHERE or m.src.is_handled(path):
            continue
        if key in MODEL_DROPS:
            m.drop(path, MODEL_DROPS[key])
            continue
        new = MODEL_RENAMES.get(key, key)
        if new not in accepted:
            m.dropped(path, MODEL_DEFAULT.format(family=family or "selected"))
        elif new != key and new in mc:
            kind = "unneeded" if mc[new] == value else "dropped"
            m.line(path, kind, f"model_config.{new} is also given ({fmt_value(mc[new])}) and is the one kept")
        elif new != key:
            m.copy(path, f"model.{new}", value)
        else:
            m.set(f"model.{new}", value)
            m.src.mark(path)
            carried.append(key)
    if carried:
        m.line(MC, "translated", f"its hyper-parameters are keys of model now ({len(carried)} carried as they are: "
               f"{', '.join(carried)})", mark=False)


def _structure_switches(m: Migration) -> None:
    """Switches of MindFormers' implementation that mf's models fix one way."""
    family = m.facts.family
    mc = m.src.mapping(MC)

    def fixed(key: str, ok: Any, reason_ok: str, reason_bad: str) -> None:
        if key in mc:
            m.line((*MC, key), "unneeded" if mc[key] == ok else "dropped", reason_ok if mc[key] == ok else reason_bad)

    act = mc.get("hidden_act")
    if "hidden_act" in mc and family == "gpt2":
        _gpt2_activation(m, act)
    elif "hidden_act" in mc:
        if act in ("silu", "swiglu"):
            m.copy((*MC, "hidden_act"), "model.hidden_act", "silu",
                   note="SwiGLU's activation is called silu in mf" if act == "swiglu" else "")
        else:
            m.set("model.hidden_act", act)
            m.action((*MC, "hidden_act"), f"model.hidden_act: {fmt_value(act)}, but mf's models implement SwiGLU "
                                          "(silu) only: `mf train` will refuse it",
                     fix="model.hidden_act")
    no_dropout = "mf's models have no dropout (0.0 is what they do)"
    for key in ("hidden_dropout", "attention_dropout", "emb_dropout_prob"):
        fixed(key, 0, no_dropout, "dropout is not implemented in mf's models")
    if family == "qwen2":
        fixed("qkv_has_bias", True, "mf's qwen2 always has q/k/v biases",
              "mf's qwen2 always has q/k/v biases (the old model had none)")
    elif family == "qwen2_moe":
        if "qkv_has_bias" in mc:
            m.copy((*MC, "qkv_has_bias"), "model.qkv_bias", mc["qkv_has_bias"] is True)
    else:
        fixed("qkv_has_bias", False, f"mf's {family} has no q/k/v biases either",
              f"q/k/v-only biases do not exist in mf's {family} model")
    fixed("add_bias_linear", False, "mf's models have no biases on their linear layers either",
          "biases on every linear layer are not supported")
    fixed("gated_linear_unit", True, "mf's MLPs are gated (SwiGLU)", "mf's MLPs are always gated (SwiGLU)")
    fixed("position_embedding_type", "rope", "mf's models use rotary embeddings", "only rotary embeddings exist in mf")
    fixed("rotary_pct", 1, "rotary embeddings cover the whole head",
          "partial rotary embeddings are not supported")
    if "qk_layernorm" in mc:
        wanted = family == "qwen3"
        fixed("qk_layernorm", wanted, f"mf's {family} {'always has' if wanted else 'has no'} q/k norm",
              f"mf's {family or 'selected'} model {'always has' if wanted else 'has no'} q/k norm")
    if "untie_embeddings_and_output_weights" in mc:
        path = (*MC, "untie_embeddings_and_output_weights")
        if "tie_word_embeddings" in mc:
            m.unneeded(path, "model_config.tie_word_embeddings is given and is the one kept")
        else:
            m.copy(path, "model.tie_word_embeddings", not mc["untie_embeddings_and_output_weights"],
                   note="the negation of untie_embeddings_and_output_weights")


_LLAMA_CLASSES = ("llama", "qwen2", "mixtral", "qwen2_moe")  # the families MindFormers built with its llama FeedForward


def llama_ffn_width(hidden: int, multiple_of: int = 256, ffn_dim_multiplier: float | None = None) -> int:
    """MindFormers' LlamaFeedForward width (mindformers/models/llama/llama_layer.py): from 4 x hidden,
    the multiplier (+ 0.01) first, then 2/3, then up to a multiple. Meta's order (2/3 first, no
    0.01) gives 28416 for llama2-70B; MindFormers' gives 28672, the width of the released weights."""
    width = 4 * hidden
    if ffn_dim_multiplier is not None:
        width = int((ffn_dim_multiplier + 0.01) * width)
    width = int(2 * width / 3)
    return multiple_of * ((width + multiple_of - 1) // multiple_of)


def _intermediate_size(m: Migration) -> None:
    """MindFormers' llama derives the MLP width from multiple_of / ffn_dim_multiplier when
    intermediate_size is not given; mf needs the number."""
    mc = m.src.mapping(MC)
    keys = [k for k in ("multiple_of", "ffn_dim_multiplier") if k in mc]
    if "intermediate_size" in mc or m.facts.family not in _LLAMA_CLASSES:
        why = ("intermediate_size is given" if "intermediate_size" in mc
               else f"only MindFormers' llama derives the MLP width from it (model {m.facts.family})")
        for key in keys:
            m.unneeded((*MC, key), why)
        return
    hidden = mc.get("hidden_size")
    if not isinstance(hidden, int) or isinstance(hidden, bool):
        return
    multiple = mc.get("multiple_of", 256)
    multiplier = mc.get("ffn_dim_multiplier")
    if not (isinstance(multiple, int) and not isinstance(multiple, bool) and multiple > 0) or not (
            multiplier is None or isinstance(multiplier, (int, float)) and not isinstance(multiplier, bool)):
        for key in keys:
            m.action((*MC, key), "intermediate_size cannot be derived from multiple_of "
                                 f"{fmt_value(multiple)} and ffn_dim_multiplier {fmt_value(multiplier)}: set "
                                 "model.intermediate_size", fix="model.intermediate_size")
        return
    width = llama_ffn_width(hidden, multiple, multiplier)
    m.set("model.intermediate_size", width)
    rule = (f"model.intermediate_size: {width}, derived as MindFormers' LlamaFeedForward does from hidden_size "
            f"{hidden}, multiple_of {multiple}" + (f", ffn_dim_multiplier {multiplier}" if multiplier is not None else ""))
    if keys:
        for key in keys:
            m.translated((*MC, key), rule)
    else:
        m.line(MC, "translated", rule + " (MindFormers' default multiple_of)", mark=False)


def _rope_scaling(m: Migration) -> None:
    mc = m.src.mapping(MC)
    method = mc.get("extend_method")
    factor = mc.get("scaling_factor")
    method_path, factor_path = (*MC, "extend_method"), (*MC, "scaling_factor")
    if method in (None, "None"):
        for path in (method_path, factor_path):
            if m.src.has(path):
                m.unneeded(path, "no context-length extension")
    elif method == "PI" and isinstance(factor, (int, float)) and not isinstance(factor, bool):
        m.copy(method_path, "model.rope_scaling", {"rope_type": "linear", "factor": float(factor)},
               note="position interpolation is linear rope scaling")
        if m.src.has(factor_path):
            m.src.mark(factor_path)
    else:
        m.dropped(method_path, f"{method} context extension has no mf rope type (mf has linear, llama3, yarn "
                               "through model.rope_scaling)")
        if m.src.has(factor_path):
            m.dropped(factor_path, "used only with extend_method")


def _multi_token_prediction(m: Migration) -> None:
    path = (*MC, "mtp_depth")
    depth = m.value(path)
    if depth is None:
        return
    factor_path = (*MC, "mtp_loss_factor")
    if isinstance(depth, int) and not isinstance(depth, bool) and depth > 0:
        m.facts.mtp_depth = depth
        if m.facts.family in ("deepseek_v3", "glm4_moe"):
            m.copy(path, "model.num_nextn_predict_layers", depth,
                   note="its multi-token-prediction modules are trained, with their loss, on the last pipeline stage")
            if m.src.has(factor_path):
                m.copy(factor_path, "model.mtp_loss_scaling_factor",
                       note="the weight of the MTP loss, divided by the depth count as MindFormers divides it")
        else:
            m.dropped(path, f"multi-token-prediction layers exist only in mf's deepseek_v3 and glm4_moe, not in its "
                            f"{m.facts.family} (the pipeline placement below leaves them out)")
    else:
        m.unneeded(path, "no multi-token-prediction layers")
    if m.src.has(factor_path) and not m.src.is_handled(factor_path):
        m.unneeded(factor_path, "no multi-token-prediction layers to weigh")


# -- MoE -------------------------------------------------------------------------------------------
def _moe(m: Migration) -> None:
    moe = m.src.mapping(("moe_config",))
    if not moe:
        return
    experts = moe.get("expert_num", 1)
    if experts in (None, 1):
        for key in moe:
            m.unneeded(("moe_config", key), "the model is dense (expert_num is 1): MoE settings had no effect")
        return
    if m.facts.family in MOE_RENAMES_BY_FAMILY:
        _routed_experts(m, moe)
        return
    if m.facts.family != "deepseek_v3":  # not reached: _variant maps or refuses every sparse dense family
        raise ConfigError("moe_config.expert_num", f"mf's {m.facts.family} model is dense; refused")
    mc = m.src.mapping(MC)
    for key, new in MOE_RENAMES.items():
        if key not in moe:
            continue
        value = moe[key]
        if key == "first_k_dense_replace" and isinstance(value, bool):
            value = int(value)  # MindFormers' default True meant "the first layer is dense"
        if new in mc:
            m.unneeded(("moe_config", key), f"model_config.{new} is also given and is the one kept")
        else:
            m.copy(("moe_config", key), f"model.{new}", value)
    defaults = {k: v for k, v in MOE_DEFAULTS.items()
                if m.get_new(f"model.{k}") is None and k not in mc}
    for key, value in defaults.items():
        m.set(f"model.{key}", value)
    if defaults:
        written = ", ".join(f"{k} {fmt_value(v)}" for k, v in defaults.items())
        m.line(("moe_config",), "translated", f"MindFormers' MoE defaults written where Hugging Face's differ: {written}",
               mark=False)
    if "use_gating_sigmoid" in moe:
        sigmoid = moe["use_gating_sigmoid"] is True
        m.line(("moe_config", "use_gating_sigmoid"), "unneeded" if sigmoid else "dropped",
               "mf's deepseek_v3 router scores with sigmoid" if sigmoid
               else "mf's deepseek_v3 router always scores with sigmoid (MindFormers scored with softmax)")
    m.drop_table(("moe_config",), MOE_DROPS, gone("not a mixture-of-experts setting mf knows"))


def _routed_experts(m: Migration, moe: dict) -> None:
    """moe_config -> mixtral / qwen3_moe expert keys; MindFormers' per-layer balance loss
    (aux_loss_factor) is the Switch loss those models train with output_router_logits."""
    family, mc = m.facts.family, m.src.mapping(MC)
    for key, new in MOE_RENAMES_BY_FAMILY[family].items():
        if key not in moe:
            continue
        if new in mc:
            m.unneeded(("moe_config", key), f"model_config.{new} is also given and is the one kept")
        else:
            m.copy(("moe_config", key), f"model.{new}", moe[key])
    for key, value in MOE_DEFAULTS_BY_FAMILY[family].items():
        if m.get_new(f"model.{key}") is None and key not in mc:
            m.set(f"model.{key}", value)
            m.line(("moe_config",), "translated", f"model.{key}: {fmt_value(value)} (MindFormers' MoE default)",
                   mark=False)
    if family == "qwen2_moe":
        _qwen2_moe_experts(m, moe)
    aux = moe.get("aux_loss_factor")
    if "aux_loss_factor" in moe:
        if isinstance(aux, (int, float)) and not isinstance(aux, bool) and aux > 0:
            m.set("model.output_router_logits", True)
            m.copy(("moe_config", "aux_loss_factor"), "model.router_aux_loss_coef", float(aux),
                   note="with model.output_router_logits: True (the load-balancing loss is trained)")
        else:
            m.unneeded(("moe_config", "aux_loss_factor"), "no load-balancing loss")
    if "aux_loss_types" in moe:
        m.dropped(("moe_config", "aux_loss_types"), f"mf's {family} trains the Switch balance loss only")
    if "capacity_factor" in moe:
        m.line(("moe_config", "capacity_factor"), "dropped" if (moe["capacity_factor"] or 0) > 0 else "unneeded",
               "mf's MoE is dropless: MindFormers dropped tokens above the capacity, mf routes every token")
    if "use_gating_sigmoid" in moe:
        m.line(("moe_config", "use_gating_sigmoid"), "dropped" if moe["use_gating_sigmoid"] else "unneeded",
               f"mf's {family} router scores with softmax")
    m.drop_table(("moe_config",), MOE_DROPS, gone(f"not a mixture-of-experts setting of mf's {family}"))


def _qwen2_moe_experts(m: Migration, moe: dict) -> None:
    """MindFormers' llama MoE sized every expert (and each shared one) with intermediate_size;
    Qwen2-MoE's shared expert is shared_expert_num of them fused, scaled by its sigmoid gate."""
    width = m.get_new("model.intermediate_size")
    if isinstance(width, int) and not isinstance(width, bool):
        m.set("model.moe_intermediate_size", width)
        m.line(("moe_config",), "translated", f"model.moe_intermediate_size: {width} (MindFormers sized each routed "
                                              "expert with model_config.intermediate_size)", mark=False)
    shared = moe.get("shared_expert_num") or 0
    if "shared_expert_num" in moe:
        if isinstance(width, int) and isinstance(shared, (int, float)) and not isinstance(shared, bool) \
                and float(shared).is_integer():
            m.copy(("moe_config", "shared_expert_num"), "model.shared_expert_intermediate_size", int(shared) * width,
                   note=f"{fmt_value(shared)} experts of intermediate_size {width}: one shared expert that wide")
        else:
            m.action(("moe_config", "shared_expert_num"), f"{fmt_value(shared)} shared experts of intermediate_size "
                                                          f"{fmt_value(width)}: set model.shared_expert_intermediate_size",
                     fix="model.shared_expert_intermediate_size")
    else:
        m.set("model.shared_expert_intermediate_size", 0)
    if "use_shared_expert_gating" in moe:
        m.unneeded(("moe_config", "use_shared_expert_gating"), "mf's qwen2_moe gates its shared expert")


# -- GPT-2 and ChatGLM ----------------------------------------------------------------------------
_GPT2_DROPOUTS = {"hidden_dropout_rate": "resid_pdrop", "attention_dropout_rate": "attn_pdrop",
                  "embedding_dropout_prob": "embd_pdrop"}


def _gpt2(m: Migration) -> None:
    """MindFormers' GPT2Config: the MLP width as a ratio, dropout rates under its own names (mf has
    no dropout: written 0.0), positions up to seq_length unless given, LayerNorm after the
    residual refused (post_layernorm_residual: a different network)."""
    mc = m.src.mapping(MC)
    hidden = mc.get("hidden_size", 768)
    if "expand_ratio" in mc:
        ratio = mc["expand_ratio"]
        if isinstance(ratio, int) and not isinstance(ratio, bool) and isinstance(hidden, int) and ratio > 0:
            m.copy((*MC, "expand_ratio"), "model.n_inner", ratio * hidden, note=f"{ratio} x hidden_size")
        else:
            m.action((*MC, "expand_ratio"), f"{fmt_value(ratio)}: set model.n_inner (the MLP width) by hand",
                     fix="model.n_inner")
    for old, new in _GPT2_DROPOUTS.items():
        value = mc.get(old, 0.1)       # MindFormers' GPT2Config defaults are 0.1 (HF's are too)
        m.set(f"model.{new}", 0.0)
        note = f"model.{new}: 0.0 is written: dropout is not implemented in mf"
        if old in mc:
            m.line((*MC, old), "unneeded" if value == 0 else "dropped",
                   note if value != 0 else f"model.{new}: 0.0 (no dropout)")
        elif value != 0:
            m.line(MC, "dropped", f"{old} (MindFormers' default {value}): {note}", mark=False)
    if "max_position_embeddings" not in mc and "seq_length" in mc:
        m.set("model.n_positions", mc["seq_length"])
        m.line((*MC, "seq_length"), "translated", f"model.n_positions: {fmt_value(mc['seq_length'])} (MindFormers' "
                                                  "GPT-2 sizes its position table by seq_length unless "
                                                  "max_position_embeddings is given)", mark=False)
    if "post_layernorm_residual" in mc:
        if mc["post_layernorm_residual"]:
            raise ConfigError("model.model_config.post_layernorm_residual", "True: the residual taken after the "
                                                                            "LayerNorm is not GPT-2's block (mf's gpt2 is "
                                                                            "transformers'); refused")
        m.unneeded((*MC, "post_layernorm_residual"), "mf's gpt2 takes the residual before the LayerNorm too")
    if "num_labels" in mc:
        m.unneeded((*MC, "num_labels"), "the class count of MindFormers' GPT-2 classification head, not of the LM")
    if "use_prompt_flash_attention" in mc:
        m.unneeded((*MC, "use_prompt_flash_attention"), "a fused-kernel switch of MindFormers' inference")


# MindFormers' GPT-2 builds its MLP with MindSpore's nn.GELU, the tanh approximation by default:
# transformers' gelu_new.
_GPT2_ACTIVATIONS = {"gelu": "gelu_new", "fast_gelu": "gelu_new", "relu": "relu"}


def _gpt2_activation(m: Migration, act: Any) -> None:
    path = (*MC, "hidden_act")
    if act in _GPT2_ACTIVATIONS:
        m.copy(path, "model.activation_function", _GPT2_ACTIVATIONS[act],
               note="MindSpore's GELU (MindFormers' gelu) is the tanh approximation, transformers' gelu_new"
               if act != "relu" else "")
    else:
        m.action(path, f"{fmt_value(act)}: not an activation of mf's gpt2 (gelu_new, gelu, relu): set "
                       "model.activation_function", fix="model.activation_function")


# ChatGLM2Config switches -> the value GlmForCausalLM fixes (anything else is another network).
_CHATGLM_FIXED = {
    "rmsnorm": (True, "RMSNorm"), "apply_residual_connection_post_layernorm": (False, "the residual before the norm"),
    "post_layer_norm": (True, "a final norm"), "add_bias_linear": (False, "no biases but q/k/v's"),
    "quantization_bit": (0, "unquantized weights"), "pre_seq_len": (None, "no P-tuning prefix"),
}
_GLM4_VOCAB = 151552


def _chatglm(m: Migration) -> None:
    """MindFormers' ChatGLM2 classes (ChatGLM2-6B, ChatGLM3-6B, GLM-4-9B): transformers'
    GlmForCausalLM when every switch says that network; refused otherwise, naming the switch. Not
    Glm4ForCausalLM: that is GLM-4-0414, whose extra norms after the attention and the MLP no
    ChatGLM2 config describes."""
    mc = m.src.mapping(MC)
    for key, (want, what) in _CHATGLM_FIXED.items():
        if key not in mc:
            continue
        value = mc[key]
        if value == "None":
            value = None
        if value != want:
            raise ConfigError(f"model.model_config.{key}", f"{fmt_value(mc[key])}: mf's glm (transformers' "
                                                           f"GlmForCausalLM) has {what}; this ChatGLM2 variant is "
                                                           "another network and is refused")
        m.unneeded((*MC, key), f"mf's glm has {what}")
    vocab = mc.get("padded_vocab_size", mc.get("vocab_size"))
    model = "GLM-4-9B" if vocab == _GLM4_VOCAB else "ChatGLM2/3-6B"
    m.line(MC, "translated", f"model.model_type: glm ({model}'s ChatGLM2 network is transformers' GlmForCausalLM; "
                             "not Glm4ForCausalLM, GLM-4-0414 with two more norms per layer)", mark=False)
    if "add_qkv_bias" in mc:
        m.copy((*MC, "add_qkv_bias"), "model.attention_bias", mc["add_qkv_bias"] is True)
    heads = mc.get("num_attention_heads")
    if mc.get("multi_query_attention") is True:
        if "multi_query_group_num" in mc:
            m.copy((*MC, "multi_query_group_num"), "model.num_key_value_heads")
        m.unneeded((*MC, "multi_query_attention"), "grouped key/value heads: model.num_key_value_heads")
    elif "multi_query_attention" in mc:
        m.set("model.num_key_value_heads", heads)
        m.translated((*MC, "multi_query_attention"), f"model.num_key_value_heads: {fmt_value(heads)} (one key per head)")
        if "multi_query_group_num" in mc:
            m.unneeded((*MC, "multi_query_group_num"), "used only with multi_query_attention")
    ratio = mc.get("rope_ratio", 1)
    if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and ratio > 0:
        m.set("model.rope_theta", 10000.0 * ratio)
        text = f"model.rope_theta: {10000.0 * ratio} (ChatGLM's base 10000 x rope_ratio {fmt_value(ratio)})"
        if "rope_ratio" in mc:
            m.translated((*MC, "rope_ratio"), text)
        else:
            m.line(MC, "translated", text, mark=False)
    else:
        m.action((*MC, "rope_ratio"), f"{fmt_value(ratio)}: set model.rope_theta (10000 x rope_ratio)",
                 fix="model.rope_theta")
    if "seq_length" in mc and "max_position_embeddings" not in mc:
        m.set("model.max_position_embeddings", mc["seq_length"])
    for key, why in (("apply_query_key_layer_scaling", "a rescaling of the attention scores that cancels out"),
                     ("attention_softmax_in_fp32", "mf's softmax computes in float32"),
                     ("bias_dropout_fusion", _KERNEL_NOTE), ("prefix_projection", "used only with pre_seq_len"),
                     ("mlp_concat", _KERNEL_NOTE)):
        if key in mc:
            m.unneeded((*MC, key), why)


_KERNEL_NOTE = "a fused-kernel or layout switch of MindFormers' implementation; mf-models picks its kernels itself"


# -- LoRA and generation ----------------------------------------------------------------------------
_LORA_KEYS = ("lora_rank", "lora_alpha", "lora_dropout", "target_modules")


def _lora(m: Migration) -> None:
    base = (*MC, "pet_config")
    pet = m.src.mapping(base)
    if not pet:
        return
    if pet.get("pet_type") != "lora":
        for key in pet:
            m.dropped((*base, key), f"only LoRA adapters are supported (pet_type {fmt_value(pet.get('pet_type'))})")
        return
    m.unneeded((*base, "pet_type"), "the lora section means LoRA")
    for key in _LORA_KEYS:
        if key in pet:
            note = ("matched against mf's module names (attention.wq, feed_forward.w1, ...), which are MindFormers' "
                    "llama names" if key == "target_modules" else "")
            m.copy((*base, key), f"lora.{key}", pet[key], note=note)
    if "target_modules" not in pet:
        m.action(base, "lora.target_modules is required by mf: set the regular expression of the adapted modules",
                 fix="lora.target_modules")
        m.set("lora.target_modules", ".*")
    m.drop_table(base, {
        "param_init_type": moot("adapters take the model's params_dtype"),
        "compute_dtype": moot("adapters compute in the model's compute_dtype"),
        "lora_a_init": gone("mf initialises A randomly and B with zeros"),
        "lora_b_init": gone("mf initialises A randomly and B with zeros"),
        "exclude_layers": gone("give lora.exclude_layers as layer specs by hand", None, []),
        "freeze_include": gone("mf freezes every base weight under LoRA", None, []),
        "freeze_exclude": gone("mf freezes every base weight under LoRA", None, []),
    }, gone("not a LoRA setting mf knows"))


_GENERATION = ("do_sample", "top_k", "top_p", "temperature", "max_new_tokens")


def _generation(m: Migration) -> None:
    """MindFormers keeps generation settings in model_config. A predict config carries them to the
    inference section; a training config generates nothing with them (its end-of-training sample
    needs prompts), so they are not written there."""
    mc = m.src.mapping(MC)
    predict = m.value(("run_mode",), "train") == "predict"
    for key in _GENERATION:
        if key not in mc:
            continue
        value = mc[key]
        if value is None:
            m.unneeded((*MC, key), "null: the default of inference")
        elif not predict:
            m.unneeded((*MC, key), "a generation setting; a training run generates nothing with it (migrate the "
                                   "model's predict config for `mf generate`)")
        else:
            if key in ("top_p", "temperature") and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            m.copy((*MC, key), f"inference.{key}", value, note="used by `mf generate` with this config")
    penalty = mc.get("repetition_penalty")
    if "repetition_penalty" in mc:
        lossless = penalty is None or (isinstance(penalty, (int, float)) and penalty == 1) or not predict
        m.line((*MC, "repetition_penalty"), "unneeded" if lossless else "dropped",
               "a repetition penalty is not supported by `mf generate`" if predict
               else "a generation setting; a training run generates nothing with it")
