"""Fixtures for the TensorRT-LLM adapter tests: the stand-in `tensorrt_llm` (fake_tensorrt_llm/),
installed per test on a fresh simulated GPU."""

from __future__ import annotations

import pytest

from tests.engine.trtllm import fake_tensorrt_llm as fake

TARGET = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(autouse=True)
def simulated_waits(monkeypatch):
    """An engine built in these tests waits on the stand-in's clock (while it waits the simulated
    executor runs on): the product takes its sleep, the simulator hands it one."""
    from batchspec.engine.trtllm import adapter

    monkeypatch.setattr(adapter, "SLEEP", lambda seconds: fake._sim.STATE.clock.advance(seconds))


@pytest.fixture
def trt(monkeypatch):
    """The stand-in as `tensorrt_llm`, one empty 80 GiB GPU, builds that take no simulated time."""
    return fake.install(monkeypatch)
