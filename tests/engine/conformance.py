"""The engine contract, as tests every engine runs (fsspec's abstract-test pattern).

A test module provides three fixtures and subclasses `EngineConformance`:
- `engine`: the engine under test, loaded with a small model;
- `spec_arms`: the speculative settings it supports (besides "none"), ready to run;
- `unsupported_arm`: a setting it cannot run (check() must refuse it).
"""

from __future__ import annotations

import pytest

from batchspec.engine.base import (
    FINISH_REASONS,
    NO_SPEC,
    Engine,
    Request,
    SamplingParams,
)
from batchspec.errors import BatchspecError

PROMPTS = ["def fib(n):", "The capital of France is", "List three colours: red,", "Once upon a time"]


def requests(max_tokens: int = 8, **params) -> list[Request]:
    return [Request(f"q{i}", p, params=SamplingParams(max_tokens=max_tokens + i, **params)) for i, p in enumerate(PROMPTS)]


class EngineConformance:
    def test_is_an_engine(self, engine):
        assert isinstance(engine, Engine)
        assert engine.name and engine.model_name

    def test_one_completion_per_request_in_order(self, engine):
        result = engine.generate(requests(), NO_SPEC, 2)
        assert [c.id for c in result.completions] == [f"q{i}" for i in range(len(PROMPTS))]
        for c, r in zip(result.completions, requests()):
            assert c.finish_reason in FINISH_REASONS and c.finish_reason != "error"
            assert c.error is None and isinstance(c.text, str)
            assert 1 <= c.output_tokens == len(c.token_ids) <= r.params.max_tokens
            assert c.prompt_tokens > 0
            assert c.finish_reason == "stop" or c.output_tokens == r.params.max_tokens

    def test_plain_decoding_drafts_nothing(self, engine):
        result = engine.generate(requests(), NO_SPEC, 4)
        assert result.draft_tokens == 0 and result.accepted_tokens == 0
        assert result.acceptance_rate is None

    def test_greedy_is_deterministic_and_the_same_under_every_arm(self, engine, spec_arms):
        plain = [c.token_ids for c in engine.generate(requests(), NO_SPEC, 4).completions]
        assert plain == [c.token_ids for c in engine.generate(requests(), NO_SPEC, 1).completions]
        for spec in spec_arms:
            result = engine.generate(requests(), spec, 4)
            assert [c.token_ids for c in result.completions] == plain, spec.label
            for c in result.completions:
                assert 0 <= c.accepted_tokens <= c.draft_tokens <= spec.draft_len * c.target_steps
                assert c.target_steps >= 1

    def test_timing_adds_up(self, engine, spec_arms):
        for spec in [NO_SPEC, *spec_arms]:
            t = engine.generate(requests(), spec, 4).timing
            assert min(t.prefill_s, t.draft_s, t.verify_s, t.other_s) >= 0
            assert t.wall_s > 0 and t.decode_s + t.prefill_s <= t.wall_s * 1.05 + 0.01

    def test_a_bad_row_fails_alone(self, engine):
        batch = requests() + [Request("bad", "", params=SamplingParams(max_tokens=4))]
        result = engine.generate(batch, NO_SPEC, 4)
        bad = result.completions[-1]
        assert bad.id == "bad" and bad.finish_reason == "error" and bad.error and bad.text is None
        assert all(c.finish_reason != "error" for c in result.completions[:-1])

    def test_unsupported_settings_are_refused_up_front(self, engine, unsupported_arm):
        # The contract: a setting the engine cannot run is refused by check(), in one line,
        # before anything runs. Which settings those are is each engine's own business.
        with pytest.raises(BatchspecError) as info:
            engine.check(unsupported_arm)
        assert "\n" not in str(info.value)

    def test_sampling_is_reproducible_with_a_seed(self, engine):
        # Same seed, same batch size: same tokens. (Across batch sizes float sums may differ in
        # the last bit, which can move a draw across a boundary, as in every engine without
        # batch-invariant kernels.) An engine that does not seed each request says so on every
        # result with sampled rows instead (`seeded_sampling = False`, caveats["sampled"]).
        a = engine.generate(requests(temperature=0.8, top_p=0.95, seed=3), NO_SPEC, 4)
        b = engine.generate(requests(temperature=0.8, top_p=0.95, seed=3), NO_SPEC, 4)
        if not getattr(engine, "seeded_sampling", True):
            assert "seed" in a.caveats["sampled"] and "seed" in b.caveats["sampled"]
            return
        assert [c.token_ids for c in a.completions] == [c.token_ids for c in b.completions]
