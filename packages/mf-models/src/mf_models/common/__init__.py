"""Building blocks shared by the model folders (llama, qwen3, deepseek_v3)."""
