"""Structured output on TensorRT-LLM: a row's `response_format` as guided decoding (1.2 LLM API).

What TensorRT-LLM's source says (NVIDIA/TensorRT-LLM; docs/structured-output.md has the index
ids and the reading):
- `LLM(guided_decoding_backend=...)`: `Optional[Literal["xgrammar", "llguidance"]]`, default None,
  "llguidance is supported in PyTorch backend only" (tensorrt_llm/llmapi/llm_args.py, the 1.2-era
  copy). Without a backend the executor builds no guided decoder. The adapter builds an LLM that
  serves rows with a response_format with GUIDED_BACKEND unless the run's llm_options name one,
  whatever the arm ("none" too: like for like), and an LLM for calls without such rows as before
  (no guided decoder runs for them); a guided LLM also serves unconstrained rows.
- per request: `SamplingParams(guided_decoding=GuidedDecodingParams(json=schema))`, one guide per
  request (tensorrt_llm/sampling_params.py, `GuidedDecodingParams._validate`).
- speculation: `create_py_executor` (tensorrt_llm/_torch/pyexecutor/py_executor_creator.py) builds
  a `GuidedDecoder` where `spec_dec_mode.support_guided_decoder()` (no speculation, or a mode with a
  separate drafter: Eagle3 two-model, DraftTarget, NGram, user-provided, MTP-Eagle) and a
  `CapturableGuidedDecoder` inside the model engine where `support_capturable_guided_decoder()`
  (MTP and Eagle3 one-model); any other mode raises "Guided decoding is not supported for
  speculative decoding mode: ..." (tensorrt_llm/_torch/speculative/interface.py,
  SpeculativeDecodingMode). So every method batchspec runs has guided decoding in 1.2
  (GUIDED_DECODER); a method outside that table is refused for constrained rows, one line each.

batchspec's own forced drafts (the torch engine's) do not exist here: TensorRT-LLM's drafters
propose as they do without a grammar, and its guided decoder masks the target's logits.
Nothing here has run against real TensorRT-LLM, and jobs/gpu_check.py does not exercise it yet.
"""

from __future__ import annotations

from typing import Any, Sequence

from batchspec.engine.base import Request, SpecConfig

GUIDED_BACKENDS = ("xgrammar", "llguidance")
GUIDED_BACKEND = "xgrammar"  # TensorRT-LLM's first-named backend, implemented on both its backends
# batchspec method -> the guided decoder TensorRT-LLM 1.2 builds for it (module docstring).
GUIDED_DECODER = {
    "none": "GuidedDecoder",
    "ngram": "GuidedDecoder",
    "draft_target": "GuidedDecoder",
    "eagle3": "GuidedDecoder (two-model) or CapturableGuidedDecoder (eagle3_one_model)",
    "mtp": "CapturableGuidedDecoder",
}


def with_guided_backend(run_options: dict[str, Any]) -> dict[str, Any]:
    """The run's LLM options with GUIDED_BACKEND where they name no guided_decoding_backend."""
    return run_options if "guided_decoding_backend" in run_options else {**run_options, "guided_decoding_backend": GUIDED_BACKEND}


def guided_problem(spec: SpecConfig, run_options: dict[str, Any]) -> str | None:
    """Why rows with a response_format cannot run under `spec` (one line), or None."""
    backend = run_options.get("guided_decoding_backend")
    if backend is None:
        return ("llm_options.guided_decoding_backend is null: TensorRT-LLM enforces no response_format without "
                f"one of {', '.join(GUIDED_BACKENDS)}")
    if spec.method not in GUIDED_DECODER:
        return f"TensorRT-LLM has no guided decoding with speculative method {spec.method}"
    return None


def guided_kwargs(request: Request, guided_params: type) -> dict[str, Any]:
    """`SamplingParams` keyword arguments for the request's response_format (none without one);
    `guided_params` is tensorrt_llm.sampling_params.GuidedDecodingParams."""
    if request.response_format is None:
        return {}
    return {"guided_decoding": guided_params(json=request.response_format.schema_dict)}


def split_unguided(requests: Sequence[Request], spec: SpecConfig, run_options: dict[str, Any]) -> dict[int, str]:
    """Request index -> the one-line error of each constrained request that cannot run."""
    problem = guided_problem(spec, run_options)
    if problem is None:
        return {}
    return {i: f"response_format: {problem}" for i, r in enumerate(requests) if r.response_format is not None}
