"""`import tensorrt_llm` giving the stand-in (fake_tensorrt_llm), for processes a test cannot
monkeypatch: Ray workers started by a pipeline run. Put tests/engine/trtllm/shim and the
repository root on PYTHONPATH. The stand-in then simulates the GPUs each process sees
(CUDA_VISIBLE_DEVICES, which Ray sets to an actor's GPU ids, fake ones included).

With BATCHSPEC_STANDIN_NO_GPU=1 the import fails as TensorRT-LLM's does on a machine without a
GPU (it loads its CUDA bindings and queries the device as it imports; SOURCES.md, "Import"):
a head node of a cluster, whose workers have GPUs."""

import os
import sys

if os.environ.get("BATCHSPEC_STANDIN_NO_GPU") == "1":
    raise RuntimeError("CUDA initialization failed: no CUDA-capable device is detected (the stand-in's "
                       "BATCHSPEC_STANDIN_NO_GPU=1)")

from tests.engine.trtllm import fake_tensorrt_llm as _standin  # noqa: E402

import torch  # noqa: E402

_standin._sim.STATE.clock.realtime = True  # this process's engine sleeps for real while it waits
torch.cuda.mem_get_info = _standin.mem_get_info  # the device queries see the simulated GPUs (as install() does)
sys.modules[__name__] = _standin
sys.modules[__name__ + ".llmapi"] = _standin.llmapi
sys.modules[__name__ + ".llmapi.llm_args"] = _standin.llm_args
sys.modules[__name__ + ".sampling_params"] = _standin.sampling_params
