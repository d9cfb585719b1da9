"""jobs/gpu_check.py's calibrated-shard check, over the stand-in: the same code a GPU node runs
against real TensorRT-LLM (which this machine cannot install), here proving only that the check
passes on a correct engine and fails where an output differs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from batchspec.config.spec import run_llm_options
from batchspec.engine.base import NO_SPEC
from batchspec.engine.trtllm.adapter import TrtllmEngine
from tests.engine.trtllm.conftest import TARGET

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "jobs"))

import gpu_check  # noqa: E402


def test_the_calibrated_shard_check_passes_on_the_stand_in_and_fails_on_a_wrong_output(trt, capsys):
    args = argparse.Namespace(max_tokens=24, batch_size=2)
    engine = TrtllmEngine(TARGET, run_llm_options({}, []))
    plain = gpu_check.run_arm(engine, NO_SPEC, args.batch_size, args.max_tokens)
    assert gpu_check.check_calibrated(engine, plain, args, repeat=3)
    out = capsys.readouterr().out
    assert "calibrated shard (n-gram k=2, k=4): OK 12 rows of 12" in out and "row 0: start ngram:k=4" in out
    plain.completions[1].token_ids = plain.completions[1].token_ids[:-1]  # a plain output that no arm reproduces
    assert not gpu_check.check_calibrated(engine, plain, args, repeat=3)
    assert "greedy output differs from the plain run" in capsys.readouterr().out
    engine.close()
