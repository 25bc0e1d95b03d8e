"""GLM-4.5 (Glm4MoeForCausalLM): GQA with partial RoPE and optional q/k norms, DeepSeek-V3's MoE and
multi-token prediction.

spec.py declares the model to the registry (args.py's class, no MindSpore); model.py builds it and
parallelize.py is its parallel plan (both MindSpore, imported when a model is built).
"""
