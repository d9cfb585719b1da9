"""The torch engine through the shared engine contract, on a tiny random model."""

from __future__ import annotations

import pytest

from batchspec.engine.base import SpecConfig
from batchspec.engine.torch.engine import TorchEngine
from tests.engine.conformance import EngineConformance


class TestTorchEngine(EngineConformance):
    @pytest.fixture(scope="class")
    def engine(self, tiny_model_dir, tiny_draft_dir):
        return TorchEngine.load(str(tiny_model_dir), draft_model=str(tiny_draft_dir), device="cpu")

    @pytest.fixture(scope="class")
    def spec_arms(self, tiny_draft_dir):
        return [SpecConfig("ngram", 3), SpecConfig("draft_target", 2, draft_model=str(tiny_draft_dir)), SpecConfig("suffix", 4)]

    @pytest.fixture(scope="class")
    def unsupported_arm(self):
        return SpecConfig("mtp", 1)  # the torch engine runs NGram, Draft_Target and Suffix only
