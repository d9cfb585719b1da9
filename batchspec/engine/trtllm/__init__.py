"""The TensorRT-LLM engine: `adapter` (the engine over `tensorrt_llm.LLM`), `translate` (pure
translation to and from its API), `memory` (memory planning). `tensorrt_llm` is imported lazily."""
