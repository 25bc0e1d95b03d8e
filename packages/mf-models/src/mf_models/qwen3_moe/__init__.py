"""Qwen3-MoE (Qwen3MoeForCausalLM): Qwen3's attention and routed MoE layers.

spec.py declares the model to the registry (args.py's class, no MindSpore); model.py builds it and
parallelize.py is its parallel plan (both MindSpore, imported when a model is built).
"""
