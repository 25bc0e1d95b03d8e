"""GLM (GlmForCausalLM): GLM-4-9B, the ChatGLM architecture (GQA with q/k/v biases, partial
interleaved RoPE, SwiGLU, pre-norm blocks).

spec.py declares the model to the registry (args.py's class, no MindSpore); model.py builds it and
parallelize.py is its parallel plan (both MindSpore, imported when a model is built).
"""
