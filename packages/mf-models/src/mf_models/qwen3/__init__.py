"""Qwen3 (Qwen3ForCausalLM): Llama plus per-head q/k RMSNorm.

spec.py declares the model to the registry (args.py's class, no MindSpore); model.py builds it and
parallelize.py is its parallel plan (both MindSpore, imported when a model is built).
"""
