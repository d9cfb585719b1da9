"""The suffix arm and TensorRT-LLM 1.2 (docs/suffix.md): 1.2 has no suffix drafting, so the arm is
refused at the edge and by the adapter, in one line; what 1.2 offers across requests (NGram with
is_public_pool) builds and runs on the stand-in, and requests' draft scopes change nothing there."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from pydantic import ValidationError

from batchspec.config.candidates import resolve_spec_arg
from batchspec.config.spec import load_spec_file
from batchspec.engine.base import Request, SamplingParams
from batchspec.engine.trtllm.adapter import TrtllmEngine
from batchspec.errors import BatchspecError
from tests.engine.trtllm import fake_tensorrt_llm as fake
from tests.engine.trtllm.conftest import TARGET

CONFIGS = Path(__file__).resolve().parents[3] / "trt_configs"


def test_the_suffix_arm_is_refused_by_the_edge_and_the_adapter_in_one_line(trt):
    suffix = load_spec_file(CONFIGS / "suffix.yaml").spec
    with pytest.raises(BatchspecError) as edge:
        resolve_spec_arg(str(CONFIGS / "suffix.yaml"), None, "trtllm", None)
    assert "TensorRT-LLM 1.2 has no suffix drafting" in str(edge.value) and "\n" not in str(edge.value)
    with pytest.raises(BatchspecError) as adapter:
        TrtllmEngine(TARGET).check(suffix)
    assert "\n" not in str(adapter.value)


def test_the_stand_in_has_no_suffix_decoding_config_as_1_2(trt):
    # 1.2's speculative_config is a DecodingBaseConfig subclass; there is none for suffix or SA
    with pytest.raises(ValidationError):
        fake.llmapi.TorchLlmArgs(model=TARGET, speculative_config={"decoding_type": "SA", "max_draft_len": 4})
    assert not [name for name in dir(fake.llmapi) if name.startswith(("SA", "Suffix"))]


def test_the_shared_ngram_pool_of_1_2_runs_and_draft_scopes_change_nothing(trt, tmp_path):
    body = (CONFIGS / "ngram.yaml").read_text().replace("is_public_pool: false", "is_public_pool: true")
    path = tmp_path / "ngram_public.yaml"
    path.write_text(body)
    loaded = load_spec_file(path)
    spec, engine = loaded.spec, TrtllmEngine(TARGET, llm_options=loaded.llm_options)
    rows = [Request(f"r{i}", "def add(a, b): return a + b " * 2, params=SamplingParams(max_tokens=16)) for i in range(4)]
    plain = engine.generate(rows, spec, 4)
    scoped = engine.generate([dataclasses.replace(r, draft_scope="key") for r in rows], spec, 4)
    assert trt.built[-1].speculative_config.is_public_pool is True
    assert [c.token_ids for c in scoped.completions] == [c.token_ids for c in plain.completions]
