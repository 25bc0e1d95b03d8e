"""DeepSeek-V3 (DeepseekV3ForCausalLM): multi-head latent attention and DeepSeek MoE.

spec.py declares the model to the registry (args.py's class, no MindSpore); model.py builds it and
parallelize.py is its parallel plan (both MindSpore, imported when a model is built).
"""
