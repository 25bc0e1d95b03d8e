"""Qwen2-MoE (Qwen2MoeForCausalLM): Qwen2 attention, sparse MoE with a gated shared expert.

spec.py declares the model to the registry (args.py's class, no MindSpore); model.py builds it and
parallelize.py is its parallel plan (both MindSpore, imported when a model is built).
"""
