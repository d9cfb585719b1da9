"""Build an engine by name. With `base.ENGINE_METHODS`, the only place that knows which engines exist."""

from __future__ import annotations

from batchspec.engine.base import ENGINE_METHODS, Engine
from batchspec.errors import ConfigError

ENGINES = tuple(ENGINE_METHODS)


def create_engine(engine: str, model: str, draft_model: str | None = None, dtype: str = "float32",
                  device: str | None = None, **options) -> Engine:
    """Load `model` (and optionally `draft_model`) into the named engine.

    `options` are engine-specific (for trtllm: the LLM-API options of a trt_configs file)."""
    if engine == "torch":
        from batchspec.engine.torch.engine import TorchEngine

        return TorchEngine.load(model, draft_model=draft_model, dtype=dtype, device=device)
    if engine == "trtllm":
        from batchspec.engine.trtllm.adapter import TrtllmEngine

        # Draft models and dtype live in the trt_configs options for TensorRT-LLM.
        return TrtllmEngine(model, llm_options=options.get("llm_options"))
    raise ConfigError(f"engine: expected one of {', '.join(ENGINES)}, got {engine!r}")
