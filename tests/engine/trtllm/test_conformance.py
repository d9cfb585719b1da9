"""The TensorRT-LLM adapter through the shared engine contract (tests/engine/conformance.py), over
the stand-in `tensorrt_llm`: the same tests the torch engine passes, nothing adapter-specific."""

from __future__ import annotations

from importlib.resources import files

import pytest

from batchspec.config.spec import load_spec_file, run_llm_options
from batchspec.engine.base import SpecConfig
from batchspec.engine.trtllm.adapter import TrtllmEngine
from tests.engine.conformance import EngineConformance
from tests.engine.trtllm import fake_tensorrt_llm as fake
from tests.engine.trtllm.conftest import TARGET

CONFIGS = files("batchspec.data") / "trt_configs"


class TestTrtllmEngine(EngineConformance):
    @pytest.fixture(scope="class")
    def spec_arms(self):
        ngram = load_spec_file(str(CONFIGS / "ngram.yaml")).spec.with_draft_len(3)
        eagle = load_spec_file(str(CONFIGS / "eagle3.yaml")).spec.with_draft_len(2)
        draft = load_spec_file(str(CONFIGS / "draft_target.yaml")).spec.with_draft_len(2)
        return [ngram, eagle, draft]

    @pytest.fixture(scope="class")
    def engine(self, spec_arms):
        with pytest.MonkeyPatch.context() as mp:
            fake.install(mp)
            engine = TrtllmEngine(TARGET, run_llm_options({}, spec_arms))
            yield engine
            engine.close()

    @pytest.fixture(scope="class")
    def unsupported_arm(self):
        return SpecConfig("draft_target", 2)  # a draft/target arm without its draft model
