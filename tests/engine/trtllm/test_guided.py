"""Structured output through the TensorRT-LLM adapter (batchspec.engine.trtllm.guided), over the
stand-in `tensorrt_llm`, which follows the source guided.py cites: an arm serving constrained rows
is built with a guided decoding backend, each constrained row carries `GuidedDecodingParams(json=schema)` and the others
none, every speculative method batchspec runs gets TensorRT-LLM 1.2's guided decoder for it, and a
run that turns the backend off gets one-line row errors for its constrained rows only."""

from __future__ import annotations

import pytest

from batchspec.config.spec import check_llm_options
from batchspec.engine.base import NO_SPEC, Request, SamplingParams
from batchspec.engine.response_format import parse_response_format
from batchspec.errors import ConfigError
from tests.engine.trtllm.test_first_contact import arm, engine_for

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
FMT = parse_response_format({"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}})


def mixed() -> list[Request]:
    return [Request("c0", "Name a city", params=SamplingParams(max_tokens=8), response_format=FMT),
            Request("u1", "The capital of France is", params=SamplingParams(max_tokens=8)),
            Request("c2", "Name a river", params=SamplingParams(max_tokens=8), response_format=FMT)]


@pytest.mark.parametrize("name,decoder", [
    (None, "GuidedDecoder"), ("ngram.yaml", "GuidedDecoder"), ("draft_target.yaml", "GuidedDecoder"),
    ("eagle3.yaml", None),
])
def test_every_arm_is_built_with_a_guided_backend_and_constrained_rows_carry_their_schema(trt, name, decoder):
    spec = NO_SPEC if name is None else arm(name)
    engine = engine_for(*([] if name is None else [spec]))
    result = engine.generate(mixed(), spec, 3)
    assert [c.error for c in result.completions] == [None, None, None]
    llm = engine._live.llm
    assert llm.args.guided_decoding_backend == "xgrammar"
    expected = decoder or ("CapturableGuidedDecoder" if llm.args.speculative_config.one_model else "GuidedDecoder")
    assert llm.guided_decoder == expected
    assert [g.json if g is not None else None for g in llm.guided] == [SCHEMA, None, SCHEMA]


def test_the_backend_is_added_only_for_calls_with_constrained_rows_and_then_kept(trt):
    engine = engine_for()
    free = [r for r in mixed() if r.response_format is None]
    engine.generate(free, NO_SPEC, 3)
    assert engine._live.llm.args.guided_decoding_backend is None and trt.builds == 1  # as before structured output
    engine.generate(mixed(), NO_SPEC, 3)
    assert engine._live.llm.args.guided_decoding_backend == "xgrammar" and trt.builds == 2
    engine.generate(free, NO_SPEC, 3)
    assert engine._live.llm.args.guided_decoding_backend == "xgrammar" and trt.builds == 2  # the guided LLM serves them


def test_a_run_that_names_its_backend_keeps_it(trt):
    engine = engine_for(base={"guided_decoding_backend": "llguidance"})
    engine.generate(mixed(), NO_SPEC, 3)
    assert engine._live.llm.args.guided_decoding_backend == "llguidance"


def test_a_run_without_a_backend_fails_its_constrained_rows_only(trt):
    engine = engine_for(base={"guided_decoding_backend": None})
    result = engine.generate(mixed(), NO_SPEC, 3)
    errors = [c.error for c in result.completions]
    assert errors[1] is None and errors[0] == errors[2]
    assert errors[0].startswith("response_format: llm_options.guided_decoding_backend is null") and "\n" not in errors[0]
    assert len(engine._live.llm.guided) == 1  # only the unconstrained row reached TensorRT-LLM


def test_an_unknown_backend_is_refused_at_the_edge():
    with pytest.raises(ConfigError, match=r"^p.yaml: guided_decoding_backend: expected xgrammar, llguidance or null, got 'outlines' \(str\)$"):
        check_llm_options("p.yaml", {"guided_decoding_backend": "outlines"})
