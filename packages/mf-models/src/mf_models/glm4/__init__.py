"""GLM-4 (Glm4ForCausalLM): GQA with q/k/v biases, partial interleaved RoPE, post-attention and
post-MLP norms.

spec.py declares the model to the registry (args.py's class, no MindSpore); model.py builds it and
parallelize.py is its parallel plan (both MindSpore, imported when a model is built).
"""
