"""The TensorRT-LLM adapter, tested without TensorRT-LLM (it cannot be installed here).

Stand-in objects carry the attribute names of TensorRT-LLM's own source (NVIDIA/TensorRT-LLM):
- RequestOutput / CompletionOutput: tensorrt_llm/executor/result.py at commit
  005bc848893f575ec14b45d6b13139360d67c790 (CompletionOutput: index, text, token_ids,
  finish_reason in 'stop' | 'length' | 'timeout' | 'cancelled' | None; GenerationResultBase:
  decoding_iter; RequestOutput adds prompt_token_ids and outputs).
- llm.get_stats() entries: the keys asserted by tests/unittest/_torch/speculative/test_eagle3.py
  (test_eagle3_spec_decoding_stats) at commit 03dd9bb8387c5c3015f41124da0f338751a177c0, the
  SpecDecodingStats struct of cpp/include/tensorrt_llm/executor/executor.h, and the JSON-string
  form documented by LLM.get_stats in older tensorrt_llm/llmapi/llm.py.
- decoding-config fields: tensorrt_llm/llmapi/llm_args.py, the 1.2-era copy (see
  tests/engine/trtllm/fake_tensorrt_llm/SOURCES.md).
The adapter's flow over a whole stand-in library is tested in tests/engine/trtllm/. Nothing here proves the adapter works against real TensorRT-LLM; jobs/gpu_check.py does that on
a GPU node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from batchspec.config.spec import load_spec_file, run_llm_options
from batchspec.engine.base import NO_SPEC, Request, SamplingParams
from batchspec.engine.trtllm.adapter import TrtllmEngine
from batchspec.engine.trtllm.install import import_trtllm
from batchspec.engine.trtllm.memory import ModelSize, model_size, plan_draft_memory
from batchspec.engine.trtllm.iterstats import IterationSpecStats, parse_entries, stats_from_iterations
from batchspec.engine.trtllm.translate import (
    SPEC_KEYS,
    DecodingConfigSpec,
    completion_from_output,
    llm_kwargs,
    sampling_kwargs,
)
from batchspec.errors import EngineUnavailable

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "trt_configs"


def spec_of(name: str):
    return load_spec_file(CONFIGS / name).spec


# ---- the library is missing here ----------------------------------------------------------------


def test_engine_is_unavailable_here_with_one_line():
    if "tensorrt_llm" in sys.modules:
        pytest.skip("tensorrt_llm is importable here")
    for attempt in (import_trtllm, lambda: TrtllmEngine("meta-llama/Llama-3.1-8B-Instruct")):
        with pytest.raises(EngineUnavailable) as info:
            attempt()
        message = str(info.value)
        assert "\n" not in message
        assert message.startswith("engine trtllm needs tensorrt_llm (TensorRT-LLM 1.2) on a GPU node: pip install")
        assert "not importable here: ModuleNotFoundError" in message


# ---- config -> LLM kwargs ---------------------------------------------------------------------


def test_ngram_file_becomes_llm_kwargs():
    ngram = spec_of("ngram.yaml")
    kwargs = llm_kwargs("meta-llama/Llama-3.1-8B-Instruct", ngram, run_llm_options({}, [ngram]), batch_size=16)
    assert kwargs["speculative_config"] == DecodingConfigSpec("NGramDecodingConfig", {
        "max_draft_len": 4, "max_matching_ngram_size": 3,
        "is_keep_all": True, "is_use_oldest": True, "is_public_pool": False,
    })
    assert kwargs["model"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert kwargs["disable_overlap_scheduler"] is True
    assert kwargs["kv_cache_config"] == {"free_gpu_memory_fraction": 0.85}
    assert kwargs["max_batch_size"] == 16 and kwargs["enable_iter_perf_stats"] is True
    assert kwargs["max_stats_len"] >= 1000


@pytest.mark.parametrize("name, class_name, decoding_type", [
    ("eagle3.yaml", "Eagle3DecodingConfig", "Eagle3"),
    ("draft_target.yaml", "DraftTargetDecodingConfig", "Draft_Target"),
    ("ngram.yaml", "NGramDecodingConfig", "NGram"),
])
def test_speculative_kwargs_are_fields_of_the_tensorrt_llm_class(name, class_name, decoding_type):
    decoding = llm_kwargs("m", spec_of(name), {}, 4)["speculative_config"]
    assert decoding.class_name == class_name
    assert set(decoding.kwargs) <= set(SPEC_KEYS[decoding_type]) - {"decoding_type"}
    assert decoding.kwargs["max_draft_len"] == spec_of(name).draft_len


def test_draft_models_travel_as_speculative_model_dir():
    eagle = llm_kwargs("m", spec_of("eagle3.yaml"), {}, 1)["speculative_config"].kwargs
    assert eagle["speculative_model_dir"] == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B" and eagle["eagle3_one_model"] is True
    arm = spec_of("draft_target.yaml").with_draft_len(2)
    draft = llm_kwargs("m", arm, {}, 1)["speculative_config"].kwargs
    assert draft == {"max_draft_len": 2, "speculative_model_dir": "meta-llama/Llama-3.2-1B-Instruct"}


def test_every_arm_is_built_with_the_run_options():
    arms = [spec_of("ngram.yaml"), spec_of("draft_target.yaml")]
    run = run_llm_options(load_spec_file(CONFIGS / "none.yaml").llm_options | {"max_batch_size": 64}, arms)
    plain, arm = llm_kwargs("m", NO_SPEC, run, batch_size=8), llm_kwargs("m", arms[1], run, batch_size=8)
    assert plain["speculative_config"] is None
    assert plain["kv_cache_config"] == arm["kv_cache_config"] == {"free_gpu_memory_fraction": 0.85, "enable_block_reuse": True}
    assert plain["disable_overlap_scheduler"] is arm["disable_overlap_scheduler"] is True
    assert plain["max_batch_size"] == 8  # the production batch size: at most that many at once


# ---- rows -> SamplingParams -------------------------------------------------------------------


def test_sampling_kwargs():
    greedy = sampling_kwargs(SamplingParams(max_tokens=32, top_p=0.5))
    assert greedy == {"max_tokens": 32, "temperature": 0.0}
    sampled = sampling_kwargs(SamplingParams(max_tokens=8, temperature=0.7, top_p=0.9, seed=3, stop=("\n\n",)))
    assert sampled == {"max_tokens": 8, "temperature": 0.7, "top_p": 0.9, "seed": 3, "stop": ["\n\n"]}


# ---- RequestOutput -> Completion --------------------------------------------------------------


def request_output(token_ids, decoding_iter, finish_reason="length", prompt_len=5, text="t"):
    """A RequestOutput stand-in with the attribute names of tensorrt_llm/executor/result.py."""
    completion = types.SimpleNamespace(index=0, text=text, token_ids=list(token_ids), cumulative_logprob=None,
                                       logprobs=[], finish_reason=finish_reason, stop_reason=None)
    return types.SimpleNamespace(request_id=1, prompt="p", prompt_token_ids=list(range(prompt_len)),
                                 outputs=[completion], finished=True, decoding_iter=decoding_iter)


def test_speculative_output_counts():
    # 10 tokens in 4 iterations: the context step made 1, three decode steps made 9 = 3 bonus + 6 accepted
    c = completion_from_output(Request("r1", prompt="p"), request_output(range(10), 4, "stop"), draft_len=4)
    assert (c.id, c.text, c.token_ids, c.prompt_tokens, c.output_tokens) == ("r1", "t", list(range(10)), 5, 10)
    assert (c.finish_reason, c.target_steps, c.accepted_tokens, c.draft_tokens) == ("stop", 3, 6, 12)


def test_plain_output_has_no_acceptance():
    c = completion_from_output(Request("r"), request_output(range(7), 7, None), draft_len=0)
    assert (c.finish_reason, c.target_steps, c.accepted_tokens, c.draft_tokens) == ("length", 6, 0, 0)


def test_missing_decoding_iter_claims_no_speculation():
    c = completion_from_output(Request("r"), request_output(range(5), 0), draft_len=4)
    assert (c.target_steps, c.accepted_tokens, c.draft_tokens) == (4, 0, 0)


@pytest.mark.parametrize("reason", ["timeout", "cancelled"])
def test_timeout_and_cancel_become_error_rows(reason):
    c = completion_from_output(Request("r"), request_output(range(3), 2, reason), draft_len=4)
    assert (c.finish_reason, c.text, c.prompt_tokens) == ("error", None, 5)
    assert reason in c.error


# ---- get_stats() -> shard statistics ----------------------------------------------------------


def iteration(i, drafted, accepted, requests, draft_ms=1.0):
    return {"iter": i, "iterLatencyMS": 10.0, "numActiveRequests": requests, "specDecodingStats": {
        "numDraftTokens": drafted, "numAcceptedTokens": accepted, "numRequestsWithDraftTokens": requests,
        "acceptanceLength": (accepted + requests) / requests if requests else 0.0,
        "iterLatencyMS": draft_ms, "draftOverhead": draft_ms / 10.0}}


def test_stats_from_iterations():
    entries = [
        {"iter": 0, "iterLatencyMS": 20.0, "numActiveRequests": 2},  # context step: no specDecodingStats
        iteration(1, 0, 0, 0),  # an iteration without drafts
        iteration(2, 8, 6, 2),
        json.dumps(iteration(3, 8, 2, 2)),  # older releases hand back JSON strings
    ]
    stats = stats_from_iterations(parse_entries(entries))
    assert (stats.iterations, stats.spec_iterations, stats.draft_tokens, stats.accepted_tokens, stats.requests_with_drafts) == (4, 2, 16, 8, 4)
    assert stats.acceptance_rate == 0.5 and stats.mean_accepted_len == 3.0
    assert stats.iter_latency_s == pytest.approx(0.05) and stats.draft_latency_s == pytest.approx(0.002)
    assert (stats + stats).draft_tokens == 32
    assert IterationSpecStats().acceptance_rate is None and IterationSpecStats().mean_accepted_len is None


# ---- memory planning for DraftTarget ------------------------------------------------------------

GIB = 2**30
TARGET = ModelSize(weight_bytes=16 * GIB, kv_bytes_per_token=128 * 1024)  # Llama-3.1-8B, bf16
DRAFT = ModelSize(weight_bytes=2 * GIB, kv_bytes_per_token=32 * 1024)  # Llama-3.2-1B, bf16


def test_draft_that_fits_keeps_its_length():
    plan = plan_draft_memory(80 * GIB, TARGET, DRAFT, fraction=0.9, batch_size=64, max_seq_len=4096, draft_len=4)
    assert (plan.draft_len, plan.reason) == (4, None)


def test_tight_memory_shortens_the_draft():
    # budget for 4 sequences of 4096+k tokens at 160 KiB each: fits k=2 but not k=4
    need = lambda k: 4 * (4096 + k) * (160 * 1024)
    free = TARGET.weight_bytes + DRAFT.weight_bytes + need(2) + 1
    plan = plan_draft_memory(free, TARGET, DRAFT, fraction=1.0, batch_size=4, max_seq_len=4096, draft_len=4)
    assert plan.draft_len == 2 and "using 2" in plan.reason


def test_no_room_for_the_draft_means_none():
    plan = plan_draft_memory(18 * GIB, TARGET, DRAFT, fraction=0.9, batch_size=64, max_seq_len=4096, draft_len=4)
    assert plan.draft_len == 0 and "draft model does not fit" in plan.reason and "\n" not in plan.reason


def test_model_size_reads_a_local_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 2048}))
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1000)
    assert model_size(tmp_path) == ModelSize(1000, 2 * 16 * 8 * 64 * 2)
    assert model_size("meta-llama/Llama-3.2-1B-Instruct") is None  # a hub id: unknown until downloaded


