"""What a node needs before TensorRT-LLM can run: the package, found on the driver without importing
it (the import loads CUDA bindings a head node without a GPU does not have) and imported in the
workers; an environment that leaves placement to batchspec; and model locations it can load.
Each failure is one line saying what to do."""

from __future__ import annotations

import importlib
import importlib.util
import os

from batchspec.errors import ConfigError, EngineUnavailable

INSTALL_HINT = (
    "pip install tensorrt_llm==1.2.* --extra-index-url https://pypi.nvidia.com "
    "(or use NVIDIA's TensorRT-LLM release container)"
)


def check_environment(environ=os.environ) -> None:
    """Refuse what makes TensorRT-LLM run other than batchspec places it: TLLM_DISABLE_MPI=1 turns
    every LLM over to TensorRT-LLM's Ray orchestrator (BaseLLM.__init__: `mpi_disabled()` sets
    orchestrator_type "ray"), whose GPU actors would wait for GPUs the worker's bundle holds."""
    if environ.get("TLLM_DISABLE_MPI") == "1":
        raise ConfigError("TLLM_DISABLE_MPI=1: TensorRT-LLM would run each LLM under its own Ray orchestrator, whose GPU "
                          "actors wait for GPUs batchspec's worker already holds; unset it (batchspec places LLMs itself)")


def require_trtllm_installed() -> None:
    """On the driver: stop before any work when tensorrt_llm is not installed, without importing it
    (importing loads its CUDA bindings, which a head node without a GPU does not have; the workers
    import it). One line saying how to get it."""
    check_environment()
    try:
        found = importlib.util.find_spec("tensorrt_llm") is not None
    except (ImportError, ValueError):  # a broken entry in sys.modules: let the workers say why
        found = True
    if not found:
        raise EngineUnavailable(f"engine trtllm needs tensorrt_llm (TensorRT-LLM 1.2) on the GPU nodes: {INSTALL_HINT}; "
                                "not installed here")


def import_trtllm():
    """In a worker: import tensorrt_llm, or raise EngineUnavailable with one line saying why."""
    check_environment()
    try:
        return importlib.import_module("tensorrt_llm")
    except Exception as exc:  # ImportError, or CUDA/driver errors raised while it imports
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise EngineUnavailable(
            f"engine trtllm needs tensorrt_llm (TensorRT-LLM 1.2) on a GPU node: {INSTALL_HINT}; "
            f"not importable here: {reason}"
        ) from None


def locate_model(name: str) -> str:
    """A model location TensorRT-LLM can load: registry names and fsspec URLs become local
    folders through batchspec.models; local folders and Hugging Face ids pass unchanged."""
    from batchspec.models import REGISTRY, resolve_model

    if name in REGISTRY or "://" in name:
        return str(resolve_model(name))
    return name
