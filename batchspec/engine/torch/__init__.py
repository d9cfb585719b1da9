"""The embedded PyTorch engine: `engine` (the public engine: requests in, completions out),
`decode` (the continuous-batching loop and its step), `measure` (cost profile, teacher-forced
logits), `drafters` (n-gram lookup and draft model), `kv` (batched KV cache and prefill), `load`
(models and tokenizers). Imports point down that list."""
