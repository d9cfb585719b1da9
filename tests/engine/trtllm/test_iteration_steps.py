"""What the adapter reads out of TensorRT-LLM's iteration stats for calibration (issue 58 item 2):
the decode steps a call ran (GenerateResult.steps, for the controller's cost table) and each row's
accepted drafts per step (Completion.accepted_steps), over the stand-in, whose stats
carry the real key names (fake_tensorrt_llm/SOURCES.md JS, PYX)."""

from __future__ import annotations

import dataclasses
from importlib.resources import files

from batchspec.config.spec import load_spec_file, run_llm_options
from batchspec.engine.base import NO_SPEC, Request, SamplingParams
from batchspec.engine.trtllm.adapter import TrtllmEngine
from batchspec.engine.trtllm.iterstats import RowCount, attach_request_steps, request_traces
from batchspec.engine.acceptance import PlainRow
from batchspec.engine.trtllm.ngram_pool import NGramPoolRules, trt_ngram_acceptance
from tests.engine.trtllm.conftest import TARGET

CONFIGS = files("batchspec.data") / "trt_configs"
TEXTS = ["abc abc abc abc", "def fib(n): return fib(n-1) + fib(", "the cat sat on the mat; the cat", "zq"]


def requests(n: int, max_tokens: int = 40) -> list[Request]:
    ids = [[3 + b for b in f"{TEXTS[i % len(TEXTS)]} {i}".encode()] for i in range(n)]
    return [Request(f"r{i}", prompt_token_ids=tuple(p), params=SamplingParams(max_tokens=max_tokens)) for i, p in enumerate(ids)]


def test_steps_are_the_decode_iterations(trt):
    arm = load_spec_file(str(CONFIGS / "ngram.yaml")).spec.with_draft_len(4)
    engine = TrtllmEngine(TARGET, run_llm_options({}, [arm]))
    result = engine.generate(requests(6), arm, 3)
    decode = [e for e in trt.audit if e["inflightBatchingStats"]["numGenRequests"] and not e["inflightBatchingStats"]["numContextRequests"]]
    assert [s.rows for s in result.steps] == [e["inflightBatchingStats"]["numGenRequests"] for e in decode]
    assert [s.seconds for s in result.steps] == [e["iterLatencyMS"] / 1000 for e in decode]
    assert {s.tokens for s in result.steps} == {5} and {s.method for s in result.steps} == {"ngram"}
    assert all(s.context > 0 for s in result.steps) and "steps" not in result.caveats
    # one row at a time no iteration mixes a prefill in: the steps commit every output token but
    # each row's first (its context step's), none twice
    alone = engine.generate(requests(3), arm, 1)
    assert sum(s.committed for s in alone.steps) + 3 == alone.output_tokens
    first = alone.steps[0]  # the first row's first step: its cache holds its prompt
    assert first.context == len(requests(3)[0].prompt_token_ids) and first.rows == 1
    engine.close()


def test_a_draft_len_schedule_or_max_concurrency_sets_each_steps_width_by_the_active_requests(trt):
    # 1.2 drafts by the active requests where the file says so (drafter.py, SOURCES.md DR): the
    # steps the cost table learns from carry the width each iteration ran, not the arm's length
    from batchspec.engine.trtllm.translate import drafts_per_row, with_draft_len_schedule

    base = load_spec_file(str(CONFIGS / "ngram.yaml")).spec.with_draft_len(4)
    scheduled = with_draft_len_schedule(base, {1: 4, 2: 2, 3: 0})
    capped = dataclasses.replace(base, options=base.options + (("speculative_config.max_concurrency", 2),))
    engine = TrtllmEngine(TARGET, run_llm_options({}, [base]))
    outputs = []
    for arm, expected in ((scheduled, {1: 5, 2: 3, 3: 1}), (capped, {1: 5, 2: 5, 3: 1}), (base, {1: 5, 2: 5, 3: 5})):
        before = len(trt.audit)
        result = engine.generate(requests(8, 24), arm, 3)
        decode = [e for e in trt.audit[before:] if e["inflightBatchingStats"]["numGenRequests"]
                  and not e["inflightBatchingStats"]["numContextRequests"]]
        assert {e["numActiveRequests"] for e in decode} >= {1, 3}  # full batches and a drain
        assert [s.tokens for s in result.steps] == [expected[e["numActiveRequests"]] for e in decode]
        assert [1 + drafts_per_row(arm, e["numActiveRequests"]) for e in decode] == [s.tokens for s in result.steps]
        # the drafts the stand-in's requests carried fit the width (none at all where it is 1)
        assert all(e["specDecodingStats"]["numDraftTokens"] <= (s.tokens - 1) * s.rows for e, s in zip(decode, result.steps))
        assert all(e["specDecodingStats"]["numDraftTokens"] == 0 for e, s in zip(decode, result.steps) if s.tokens == 1)
        assert len(result.completions) == 8 and all(c.finish_reason != "error" for c in result.completions)
        outputs.append([c.token_ids for c in result.completions])
    assert outputs[0] == outputs[1] == outputs[2]  # greedy: the same tokens whatever the drafts
    engine.close()


def test_rows_get_their_accepted_drafts_per_step_and_the_replay_predicts_them(trt):
    # the chain calibration relies on: a plain run, TensorRT-LLM's NGram rules replayed over it, and
    # the NGram LLM's own per-step counts agree step for step (greedy, private pool as shipped)
    arm = load_spec_file(str(CONFIGS / "ngram.yaml")).spec.with_draft_len(4)
    engine = TrtllmEngine(TARGET, run_llm_options({}, [arm]))
    rows = requests(6)
    plain = engine.generate(rows, NO_SPEC, 3)
    assert all(not c.accepted_steps for c in plain.completions)  # "none" drafts nothing
    spec = engine.generate(rows, arm, 3)
    assert "accepted_steps" not in spec.caveats
    for c in spec.completions:
        assert len(c.accepted_steps) == c.target_steps and sum(c.accepted_steps) == c.accepted_tokens
    plain_rows = [PlainRow(r.prompt_token_ids, c.token_ids, r.params.max_tokens) for r, c in zip(rows, plain.completions)]
    rules = NGramPoolRules(max_matching_ngram_size=3, is_public_pool=False)  # ngram.yaml's
    predicted = trt_ngram_acceptance(plain_rows, [4], rules, batch_size=3)[4]
    assert [c.accepted_steps for c in spec.completions] == predicted.steps
    assert sum(map(sum, predicted.steps)) > 0
    engine.close()


def test_counts_that_do_not_add_up_give_no_steps():
    from batchspec.engine.base import Completion

    c = Completion("a", "x", token_ids=[1, 2, 3], prompt_tokens=5, output_tokens=3, finish_reason="length", target_steps=2)
    d = Completion("b", "y", token_ids=[1, 2], prompt_tokens=5, output_tokens=2, finish_reason="length", target_steps=1)
    entries = [{"requestStats": [{"id": 7, "stage": "GENERATION_IN_PROGRESS", "contextPrefillPosition": 5,
                                  "numGeneratedTokens": n, "scheduled": True}]} for n in (1, 3)]  # an iteration dropped
    assert attach_request_steps([RowCount(5, c)], request_traces(entries)) == ["a"]  # one step seen of two
    assert c.accepted_steps == []
    assert attach_request_steps([RowCount(5, c), RowCount(5, d)], request_traces(entries)) == ["a", "b"]  # no trace for b


def test_a_row_refused_as_it_was_built_costs_the_others_nothing():
    # a request the worker refused (no executor id, no requestStats) between two that ran
    from batchspec.engine.base import Completion

    a = Completion("a", "x", token_ids=[1, 2, 3], prompt_tokens=5, output_tokens=3, finish_reason="length", target_steps=2)
    refused = Completion.failed("r", "RequestError: no room", 0)
    b = Completion("b", "y", token_ids=[1, 2], prompt_tokens=4, output_tokens=2, finish_reason="length", target_steps=1)
    entries = [{"requestStats": [{"id": i, "stage": "GENERATION_IN_PROGRESS", "contextPrefillPosition": p, "numGeneratedTokens": n,
                                  "scheduled": True} for i, p, n in rows]}
               for rows in ([(1, 5, 1), (2, 4, 1)], [(1, 5, 2), (2, 4, 2)], [(1, 5, 3)])]
    assert attach_request_steps([RowCount(5, a), RowCount(9, refused), RowCount(4, b)], request_traces(entries)) == []
    assert (a.accepted_steps, b.accepted_steps) == ([0, 0], [0])
