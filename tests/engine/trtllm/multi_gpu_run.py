"""A pipeline run over the stand-in on a local Ray cluster of fake GPUs, in its own process (Ray
initialized with `num_gpus`, the stand-in importable as tensorrt_llm via shim/). Used by
test_multi_gpu.py; runs each pipeline file in turn on one cluster and prints one JSON line per run:
its summary and the GPUs free after it, or its one-line refusal.

    python -m tests.engine.trtllm.multi_gpu_run GPUS INPUT OUTPUT PIPELINE [OUTPUT PIPELINE ...]
"""

from __future__ import annotations

import json
import os
import sys
import time

import ray

from batchspec import pipeline
from batchspec.config.run import build_config
from batchspec.errors import BatchspecError


def main(gpus: int, input: str, runs: list[str]) -> None:
    # the driver may be a head node without a GPU (BATCHSPEC_STANDIN_NO_GPU=1: `import tensorrt_llm`
    # fails here); its workers have GPUs and import it
    try:
        import tensorrt_llm  # noqa: F401

        print(json.dumps({"driver_import": "ok"}), flush=True)
    except Exception as exc:
        print(json.dumps({"driver_import": f"{type(exc).__name__}: {exc}"}), flush=True)
    env = {"PYTHONPATH": os.environ["PYTHONPATH"], "HF_HUB_OFFLINE": "1", "BATCHSPEC_STANDIN_NO_GPU": "0"}
    ray.init(address="local", num_cpus=2, num_gpus=gpus, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": env})
    for output, pipeline_file in zip(runs[::2], runs[1::2]):
        try:
            summary = pipeline.run(build_config(input, output, pipeline_file))
        except BatchspecError as exc:
            print(json.dumps({"error": str(exc)}), flush=True)
            continue
        print(json.dumps({"rows": summary.rows, "error_rows": summary.error_rows, "complete": summary.complete,
                          "free_gpus": free_gpus(gpus)}), flush=True)


def free_gpus(gpus: int, wait_s: float = 60.0) -> float:
    """The GPUs free once the run's placement group is given back. Ray frees a removed group's
    resources asynchronously (the GCS tells the raylet), so poll until all are back or `wait_s`
    passes, then report what is free: a group never given back still shows."""
    deadline = time.monotonic() + wait_s
    while (free := ray.available_resources().get("GPU", 0)) < gpus and time.monotonic() < deadline:
        time.sleep(0.2)
    return free


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3:])
