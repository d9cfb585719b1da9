"""`import tensorrt_llm` giving the stand-in (fake_tensorrt_llm), for processes a test cannot
monkeypatch: Ray workers started by a pipeline run. Put tests/engine/trtllm/shim and the
repository root on PYTHONPATH. The stand-in then simulates the GPUs each process sees
(CUDA_VISIBLE_DEVICES, which Ray sets to an actor's GPU ids, fake ones included)."""

import sys

from tests.engine.trtllm import fake_tensorrt_llm as _standin

sys.modules[__name__] = _standin
sys.modules[__name__ + ".llmapi"] = _standin.llmapi
sys.modules[__name__ + ".llmapi.llm_args"] = _standin.llm_args
sys.modules[__name__ + ".sampling_params"] = _standin.sampling_params
