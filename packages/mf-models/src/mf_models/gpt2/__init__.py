"""GPT-2 (GPT2LMHeadModel): learned positions, LayerNorm, biased MHA, GELU MLP, tied head.

spec.py declares the model to the registry (args.py's class, no MindSpore); model.py builds it and
parallelize.py is its parallel plan (both MindSpore, imported when a model is built).
"""
