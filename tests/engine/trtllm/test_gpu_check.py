"""jobs/gpu_check.py over the stand-in: the same code a GPU node runs against real TensorRT-LLM
(which this machine cannot install), here proving only that it runs, writes its JSON with every
field docs/engines/trtllm.md explains, skips the option files only the torch engine runs, and
fails clearly where an output differs. Its figures here are the stand-in's, not measurements."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine.trtllm import fake_tensorrt_llm as fake

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "trt_configs"
sys.path.insert(0, str(ROOT / "jobs"))

import gpu_check  # noqa: E402

SMALL = ["--max-tokens", "16", "--rows", "8", "--batch-sizes", "1,4", "--calibrated-rows", "24", "--gpus", "1"]


def run(tmp_path, *configs: str, extra=()) -> tuple[int, dict]:
    out = tmp_path / "check.json"
    argv = [a for c in configs for a in ("--config", str(CONFIGS / c))] + SMALL + ["--out", str(out), *extra]
    code = gpu_check.main(argv)
    return code, json.loads(out.read_text())


def test_the_check_writes_one_json_with_every_figure(trt, tmp_path):
    code, report = run(tmp_path, "none.yaml", "ngram.yaml", "eagle3.yaml", "suffix.yaml")
    assert code == 0 and report["ok"] and report["failures"] == [], report["failures"]
    assert report["tensorrt_llm"]["version"] == fake.__version__
    assert [c.get("skipped", "").split(":")[0] for c in report["configs"]][-1].endswith("suffix.yaml")  # torch-only
    assert all(c["loads"] for c in report["configs"] if "skipped" not in c)
    assert {(r["arm"], r["batch_size"]) for r in report["runs"]} == {(a, b) for a in ("none", "ngram:k=4", "eagle3:k=3") for b in (1, 4)}
    for r in report["runs"]:
        assert r["tokens_per_s"] > 0 and r["errors"] == {} and r["stats"]["missing_iterations"] == 0
        assert r["stats"]["reads"] >= 1 and r["stats"]["entries"] > 0 and r["stats"]["full_batch_share"] == 1.0
        if r["arm"] != "none":
            assert r["greedy_equal"] and r["acceptance_rate"] is not None
    # one LLM at a time, each built once its predecessor's memory was back (else: out of memory);
    # the waits are real seconds, none here (the stand-in's clock is the one that moved)
    assert len(report["builds"]) >= 6 and all({"seconds", "memory_wait_s"} <= set(b) for b in report["builds"])
    calibrated = report["calibrated"]
    assert calibrated["rows"] == 24 and calibrated["in_order"] and calibrated["errors"] == 0
    assert calibrated["greedy_differing_from_static"] == 0 and calibrated["vs_static"] > 0
    assert calibrated["static_arm"] in ("none", "ngram:k=4", "eagle3:k=3") and calibrated["events"][0]["kind"] == "start"
    assert fake.state().max_live == 1


def test_a_differing_greedy_output_fails_the_check_and_names_the_row(trt, tmp_path, monkeypatch):
    commit = fake.llm.LLM._commit

    def off_by_one(self, req, token):  # the speculative LLM writes one wrong token into row 2
        if self._spec is not None and req.id == 2 and len(req.out) == 3:
            token = fake._sim.ALPHABET[0] if token != fake._sim.ALPHABET[0] else fake._sim.ALPHABET[1]
        return commit(self, req, token)

    monkeypatch.setattr(fake.llm.LLM, "_commit", off_by_one)
    code, report = run(tmp_path, "none.yaml", "ngram.yaml")
    assert code == 1 and not report["ok"]
    assert "ngram:k=4 at batch 1: greedy output differs from the plain run (r2)" in report["failures"]


def test_without_tensorrt_llm_it_exits_2_in_one_line_and_says_so_in_the_json(tmp_path):
    if "tensorrt_llm" in sys.modules:
        pytest.skip("tensorrt_llm is importable here")
    out = tmp_path / "check.json"
    done = subprocess.run([sys.executable, str(ROOT / "jobs" / "gpu_check.py"), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("gpu_check: engine trtllm needs tensorrt_llm")
    assert json.loads(out.read_text())["failures"] == ["tensorrt_llm: not importable"]


def test_a_node_of_two_gpus_also_checks_a_worker_across_them(tmp_path):
    # a process of its own: the check starts a local Ray cluster (here of two fake GPUs) whose
    # worker imports the stand-in through shim/
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'tests' / 'engine' / 'trtllm' / 'shim'}{os.pathsep}{ROOT}",
           "HF_HUB_OFFLINE": "1", "RAY_ADDRESS": ""}
    out = tmp_path / "check.json"
    done = subprocess.run([sys.executable, str(ROOT / "jobs" / "gpu_check.py"), "--config", str(CONFIGS / "ngram.yaml"),
                           "--max-tokens", "16", "--rows", "4", "--batch-sizes", "1", "--calibrated-rows", "8", "--gpus", "2",
                           "--out", str(out)], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert json.loads(out.read_text())["multi_gpu"] == {"gpus": 2, "ok": True}
    assert "multi-GPU worker (2 GPUs, tensor_parallel_size 2): OK 24 rows, 0 errors" in done.stdout
