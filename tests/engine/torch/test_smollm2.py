"""End to end on the real packaged SmolLM2-135M-Instruct (float32, CPU)."""

from __future__ import annotations

import dataclasses

import pytest

from batchspec.engine.base import NO_SPEC, Request, SamplingParams, SpecConfig
from batchspec.engine.torch.engine import TorchEngine
from tests.engine.lossless import assert_greedy_lossless, first_difference

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
    # equal token for token, or a near-tie of the top two logits at the first difference
    assert_greedy_lossless(smol, smol_requests(), spec.completions, plain.completions) <= 1
    assert spec.accepted_tokens > 0  # the edit and code prompts copy from themselves
    # fewer target steps for the same tokens: compared on the rows whose outputs are equal (after a
    # near-tie flip a row continues differently, and its length says nothing about speculation)
    same = [(s, p) for s, p in zip(spec.completions, plain.completions) if s.token_ids == p.token_ids]
    assert len(same) >= 2 and any(s.accepted_tokens for s, _ in same)
    assert sum(s.target_steps for s, _ in same) < sum(p.target_steps for _, p in same)


def test_a_flipped_token_that_is_no_near_tie_fails_the_lossless_check(smol):
    """The check itself can fail: corrupt one token of a plain row and it must be caught."""
    plain = smol.generate(smol_requests()[:1], NO_SPEC, 1).completions
    bad = [dataclasses.replace(c, token_ids=[*c.token_ids[:3], (c.token_ids[3] + 1) % 1000, *c.token_ids[4:]]) for c in plain]
    assert first_difference(list(bad[0].token_ids), list(plain[0].token_ids)) == 3
    with pytest.raises(AssertionError, match="not the target's top two|exceeds float error"):
        assert_greedy_lossless(smol, smol_requests()[:1], bad, plain)
