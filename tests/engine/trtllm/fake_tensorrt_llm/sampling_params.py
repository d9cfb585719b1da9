"""SamplingParams: a dataclass, as tensorrt_llm/sampling_params.py (SP in SOURCES.md), with the
fields batchspec could pass. Unknown keywords are a TypeError, as with the real dataclass."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, List, Optional, Union


@dataclass(kw_only=True)
class GuidedDecodingParams:
    """As tensorrt_llm/sampling_params.py: one guide per request (`_validate` counts the set ones)."""

    json: Optional[Union[str, dict, Any]] = None
    regex: Optional[str] = None
    grammar: Optional[str] = None
    json_object: bool = False
    structural_tag: Optional[str] = None

    def _validate(self) -> None:
        num_guides = sum(bool(getattr(self, f.name)) for f in fields(self))
        if num_guides > 1:
            raise ValueError(f"Only one guide can be used for a request, but got {num_guides}.")


@dataclass
class SamplingParams:
    end_id: Optional[int] = None
    pad_id: Optional[int] = None
    max_tokens: int = 32
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[int]] = None
    include_stop_str_in_output: bool = False
    n: int = 1
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    seed: Optional[int] = None
    temperature: Optional[float] = None
    min_tokens: Optional[int] = None
    ignore_eos: bool = False
    detokenize: bool = True
    add_special_tokens: bool = True  # SP: text prompts get the tokenizer's special tokens (BOS)
    skip_special_tokens: bool = True
    return_perf_metrics: bool = False
    logprobs: Optional[int] = None
    guided_decoding: Optional[GuidedDecodingParams] = None

    @property
    def greedy(self) -> bool:
        return not self.temperature or (self.top_k == 1)

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
