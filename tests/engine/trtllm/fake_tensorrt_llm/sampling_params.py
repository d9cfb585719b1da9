"""SamplingParams: a dataclass, as tensorrt_llm/sampling_params.py (SOURCES.md, "Sampling params"),
with the fields batchspec could pass. Unknown keywords are a TypeError, as with the real dataclass.
`_setup` tokenizes stop strings without special tokens, as the LLM does before submitting ("Stop
strings"); `seed` is accepted and, on 1.2's PyTorch sampler, has no effect ("Seeds")."""

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

    def __post_init__(self) -> None:
        self._stop_word_ids: Optional[List[List[int]]] = None
        if self.pad_id is None:
            self.pad_id = self.end_id

    def _setup(self, tokenizer) -> "SamplingParams":
        """SamplingParams._setup: end_id from the tokenizer; each stop string as token ids,
        `tokenizer.encode(s, add_special_tokens=False)`."""
        if self.end_id is None:
            self.end_id = tokenizer.eos_token_id
            self.pad_id = self.pad_id if self.pad_id is not None else self.end_id
        if self.stop is not None:
            self._stop_word_ids = [tokenizer.encode(s, add_special_tokens=False) for s in self.stops]
        return self

    def _get_stop_words(self) -> List[List[int]]:
        words = [[i] for i in self.stop_token_ids or []]
        if self.stop is None:
            return words
        if self._stop_word_ids is None:
            raise RuntimeError(f"SamplingParams.stop ({self.stop}) is not processed by tokenizer, please call the setup method.")
        return words + self._stop_word_ids

    def _get_stop_reasons_and_words(self) -> list:
        reasons = list(self.stop_token_ids or []) + self.stops
        return list(zip(reasons, self._get_stop_words()))

    @property
    def greedy(self) -> bool:
        return not self.temperature or (self.top_k == 1)

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
