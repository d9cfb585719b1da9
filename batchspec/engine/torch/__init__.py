"""The embedded PyTorch engine: `engine` (the decode loop), `kv` (batched KV cache), `drafters`
(n-gram lookup and draft model), `load` (models and tokenizers)."""
