"""tensorrt_llm.llmapi: the LLM and its config classes (the names batchspec imports)."""

from .llm import LLM, CompletionOutput, GenerationResult, RequestOutput  # noqa: F401
from .llm_args import (  # noqa: F401
    CudaGraphConfig,
    DecodingBaseConfig,
    DraftTargetDecodingConfig,
    Eagle3DecodingConfig,
    EagleDecodingConfig,
    KvCacheConfig,
    MTPDecodingConfig,
    NGramDecodingConfig,
    TorchLlmArgs,
)
from .sampling_params import SamplingParams  # noqa: F401
