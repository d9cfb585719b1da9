"""End to end on the real packaged SmolLM2-135M-Instruct (float32, CPU)."""

from __future__ import annotations

import pytest

from batchspec.engine.base import NO_SPEC, Request, SamplingParams, SpecConfig
from batchspec.engine.torch_engine import TorchEngine

CODE = "def area(width, height):\n    return width * height\n\n\ndef perimeter(width, height):\n"
EDIT = (
    "Rewrite this function with the name total instead of add:\n\n"
    "def add(values):\n    result = 0\n    for value in values:\n        result += value\n    return result\n"
)


@pytest.fixture(scope="module")
def smol():
    return TorchEngine.load("smollm2-135m", dtype="float32", device="cpu")


def smol_requests() -> list[Request]:
    params = SamplingParams(max_tokens=24)
    return [
        Request("code", CODE, params=params),
        Request("edit", messages=({"role": "user", "content": EDIT},), params=params),
        Request("chat", messages=({"role": "user", "content": "What is the capital of France?"},), params=params),
    ]


def test_smollm2_answers_and_ngram_speculation_is_lossless(smol):
    plain = smol.generate(smol_requests(), NO_SPEC, 3)
    by_id = {c.id: c for c in plain.completions}
    assert all(c.error is None and c.output_tokens > 0 for c in plain.completions)
    assert "Paris" in by_id["chat"].text
    assert "return" in by_id["code"].text or "width" in by_id["code"].text
    spec = smol.generate(smol_requests(), SpecConfig("ngram", 4), 3)
    assert [c.token_ids for c in spec.completions] == [c.token_ids for c in plain.completions]
    assert spec.accepted_tokens > 0  # the edit and code prompts copy from themselves
    assert spec.target_steps < plain.target_steps
