"""Build an engine by name. With `base.ENGINE_METHODS`, the only place that knows which engines exist."""

from __future__ import annotations

from batchspec.engine.base import ENGINE_METHODS, SUFFIX_TREE_MB_DEFAULT, Engine
from batchspec.errors import ConfigError

ENGINES = tuple(ENGINE_METHODS)


def arms_are_builds(engine: str) -> bool:
    """Whether the named engine's arm switch builds a new engine (its class's `arms_are_builds`),
    asked before any is loaded: a prior run then picks only a worker's first engine
    (batchspec.prior). tests/test_prior.py holds it to the classes."""
    return engine == "trtllm"


def create_engine(engine: str, model: str, draft_model: str | None = None, dtype: str = "float32",
                  device: str | None = None, **options) -> Engine:
    """Load `model` (and optionally `draft_model`) into the named engine.

    `options` are engine-specific. For torch, `suffix_tree_mb`: the cap on the suffix arm's trees
    (the pipeline's worker.suffix_tree_mb). For trtllm, `llm_options`: the run's non-speculative LLM
    arguments, which every arm is built with (config/spec.py `run_llm_options`); `dtype` becomes
    the LLM's dtype; TensorRT-LLM runs on the worker's GPU, so a `device` other than cuda is refused."""
    if engine == "torch":
        from batchspec.engine.torch.engine import TorchEngine

        return TorchEngine.load(model, draft_model=draft_model, dtype=dtype, device=device,
                                suffix_tree_mb=options.get("suffix_tree_mb") or SUFFIX_TREE_MB_DEFAULT)
    if engine == "trtllm":
        from batchspec.engine.trtllm.adapter import TrtllmEngine

        if device not in (None, "cuda"):
            raise ConfigError(f"device: the trtllm engine runs on the worker's GPU (cuda); got {device!r}")
        # Draft models live in the arms (trt_configs speculative_model_dir), not here.
        return TrtllmEngine(model, llm_options=options.get("llm_options"), dtype=dtype)
    raise ConfigError(f"engine: expected one of {', '.join(ENGINES)}, got {engine!r}")
