"""Engines: one small protocol (`base`), two implementations (`torch/`, `trtllm/`)."""

from batchspec.engine.base import (  # noqa: F401
    Completion,
    Engine,
    GenerateResult,
    Request,
    SamplingParams,
    SpecConfig,
    Timing,
)
