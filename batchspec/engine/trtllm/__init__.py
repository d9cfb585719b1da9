"""The TensorRT-LLM engine: `adapter` (the engine over `tensorrt_llm.LLM`), `install` (what a node
needs before it can run), `translate` (pure translation to and from its API), `memory` (memory
planning). `tensorrt_llm` is imported lazily."""
