"""Workers of several GPUs (issue 58 item 3): `worker.num_gpus: 4` with `tensor_parallel_size: 4`
runs one LLM across the worker's four GPUs. A pipeline run over the stand-in on a local Ray
cluster of four fake GPUs (`ray.init(num_gpus=4)`), in a process of its own (multi_gpu_run.py):
the actor holds all four GPUs (a one-bundle STRICT_PACK placement group), its LLM claims a quarter
of the weights on each, every row comes out exactly once, and the stats say the GPUs and the
memory in use on one of them. A worker of more GPUs than any node has is refused in one line.
The driver is a head node that cannot import TensorRT-LLM (BATCHSPEC_STANDIN_NO_GPU=1 there, as
on a CPU-only head): it checks only that the package is installed, and the workers import it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.resources import files
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.data import prompts_table
from tests.engine.trtllm import fake_tensorrt_llm as fake

ROOT = Path(__file__).resolve().parents[3]
SHIM = Path(__file__).resolve().parent / "shim"
NGRAM = files("batchspec.data") / "trt_configs" / "ngram.yaml"
TARGET_WEIGHTS = fake._sim.DEFAULT_MODELS["meta-llama/Llama-3.1-8B-Instruct"].weight_bytes


def pipeline_file(tmp_path: Path, gpus: int, tp: int) -> str:
    path = tmp_path / f"p{gpus}-{tp}.yaml"
    path.write_text(
        f"engine: trtllm\nmodel: meta-llama/Llama-3.1-8B-Instruct\nspec: {NGRAM}\nshard_size: 6\nworkers: 1\n"
        f"batch_size: 4\nmax_tokens: 16\nworker: {{num_gpus: {gpus}, num_cpus: 0.5}}\n"
        f"llm_options: {{tensor_parallel_size: {tp}}}\n")
    return str(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, list[dict]]:
    """One cluster of four fake GPUs: a worker of eight GPUs (refused), then one of four."""
    tmp = tmp_path_factory.mktemp("multi_gpu")
    input = tmp / "in.parquet"
    pq.write_table(prompts_table(14), input)
    args = [str(tmp / "out8"), pipeline_file(tmp, 8, 8), str(tmp / "out"), pipeline_file(tmp, 4, 4)]
    env = {**os.environ, "PYTHONPATH": f"{SHIM}{os.pathsep}{ROOT}", "HF_HUB_OFFLINE": "1", "RAY_ADDRESS": "",
           "BATCHSPEC_STANDIN_NO_GPU": "1"}
    done = subprocess.run([sys.executable, "-m", "tests.engine.trtllm.multi_gpu_run", "4", str(input), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp, [json.loads(line) for line in done.stdout.strip().splitlines() if line.startswith("{")]


def test_a_driver_that_cannot_import_tensorrt_llm_runs_a_trtllm_job(runs):
    _, (driver, _, summary) = runs
    assert driver["driver_import"].startswith("RuntimeError: CUDA initialization failed")
    assert summary["complete"] and summary["error_rows"] == 0


def test_one_llm_across_a_workers_four_gpus(runs):
    tmp, (_, _, summary) = runs
    assert summary == {"rows": 14, "error_rows": 0, "complete": True, "free_gpus": 4.0}  # the placement group given back
    outputs = pq.read_table(tmp / "out" / "outputs").to_pylist()
    assert sorted(r["id"] for r in outputs) == [f"row-{i:04d}" for i in range(14)]  # every row exactly once
    assert all(r["error"] is None and r["output_tokens"] > 0 for r in outputs)
    stats = pq.read_table(tmp / "out" / "stats").to_pylist()
    assert len(stats) == 3 and {s["gpus"] for s in stats} == {4.0}
    # the LLM's first GPU holds a quarter of the weights, then kv_cache_config's 0.85 of what is left
    per_gpu = TARGET_WEIGHTS // 4 + int(0.85 * (80 * fake.GIB - TARGET_WEIGHTS // 4))
    assert {s["gpu_memory_per_gpu"] for s in stats} == {per_gpu}


def test_a_worker_larger_than_any_node_is_refused(runs):
    _, (_, refused, _) = runs
    assert refused == {"error": "worker.num_gpus: 8 GPUs per worker, but the largest node of the Ray cluster has 4; "
                                "a worker's LLM runs on one node"}
