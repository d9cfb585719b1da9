"""TensorRT-LLM option files pinned to release 1.2 (issue 13, defects 6-9): the key tables, the
draft_len_schedule rules, MTP's draft length, the run's common LLM options, the GPU job's model
locations. The 1.2 field sets come from the stand-in's pydantic classes, written from the 1.2-era
tensorrt_llm/llmapi/llm_args.py (tests/engine/trtllm/fake_tensorrt_llm/SOURCES.md, L12)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import pytest
import yaml

from batchspec.config.spec import load_spec_file, run_llm_options
from batchspec.engine.trtllm.translate import LLM_ARGS, SPEC_KEYS, TRTLLM_RELEASE, decoding_config_spec
from batchspec.errors import ConfigError
from tests.engine.trtllm.fake_tensorrt_llm import llm_args as l12

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = files("batchspec.data") / "trt_configs"
CLASSES = {"NGram": l12.NGramDecodingConfig, "DraftTarget": l12.DraftTargetDecodingConfig,
           "Eagle3": l12.Eagle3DecodingConfig, "MTP": l12.MTPDecodingConfig}


def write(tmp_path, text: str) -> str:
    path = tmp_path / "arm.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_spec_keys_are_exactly_the_1_2_fields(kind):
    # llm_args.py (1.2): DecodingBaseConfig ~24,200 and each subclass; speculative_model_dir is the alias
    fields = set(CLASSES[kind].model_fields) | {"speculative_model_dir"}
    assert TRTLLM_RELEASE == "1.2"
    assert set(SPEC_KEYS[kind]) == fields


@pytest.mark.parametrize("key", ["use_rejection_sampling", "acceptance_rate_threshold", "sa_config"])
def test_main_branch_fields_are_refused(tmp_path, key):
    path = write(tmp_path, f"speculative_config:\n  decoding_type: Eagle3\n  max_draft_len: 3\n  speculative_model_dir: /m\n  {key}: 1\n")
    with pytest.raises(ConfigError, match=f"speculative_config.{key}: unknown field"):
        load_spec_file(path)


def test_acceptance_length_threshold_is_a_1_2_field(tmp_path):
    path = write(tmp_path, "speculative_config:\n  decoding_type: NGram\n  max_draft_len: 3\n  acceptance_window: 8\n  acceptance_length_threshold: 1.2\n")
    assert load_spec_file(path).spec.draft_len == 3


@pytest.mark.parametrize("schedule, ok", [
    ("{1: 4, 8: 2, 32: 0}", True),   # 0 turns speculation off at large batches
    ("{4: 4, 8: 2}", False),         # 1.2 requires batch size 1 (main only needs the smallest key)
    ("{1: 3, 8: 2}", False),         # schedule[1] must equal max_draft_len
    ("{1: 4, 8: 5}", False),         # no length above max_draft_len
])
def test_draft_len_schedule_follows_1_2(tmp_path, schedule, ok):
    # llm_args.py (1.2) DecodingBaseConfig.validate_draft_len_schedule_and_sort
    path = write(tmp_path, f"speculative_config:\n  decoding_type: NGram\n  max_draft_len: 4\n  draft_len_schedule: {schedule}\n")
    parsed = yaml.safe_load(schedule)
    accepted_by_1_2 = True
    try:
        l12.NGramDecodingConfig(max_draft_len=4, draft_len_schedule=parsed)
    except Exception:
        accepted_by_1_2 = False
    assert accepted_by_1_2 is ok
    if ok:
        load_spec_file(path)
    else:
        with pytest.raises(ConfigError, match="draft_len_schedule"):
            load_spec_file(path)


def test_mtp_length_is_num_nextn_predict_layers(tmp_path):
    # llm_args.py (1.2) MTPDecodingConfig.set_max_total_draft_tokens (L12 50,372)
    spec = load_spec_file(write(tmp_path, "speculative_config:\n  decoding_type: MTP\n  max_draft_len: 3\n")).spec
    decoding = decoding_config_spec(spec)
    built = l12.MTPDecodingConfig(**decoding.kwargs)
    assert spec.label == "mtp:k=3" and built.max_draft_len == 3
    spec = load_spec_file(write(tmp_path, "speculative_config:\n  decoding_type: MTP\n  num_nextn_predict_layers: 2\n")).spec
    assert spec.draft_len == 2 and l12.MTPDecodingConfig(**decoding_config_spec(spec).kwargs).max_draft_len == 2
    with pytest.raises(ConfigError, match="num_nextn_predict_layers"):
        load_spec_file(write(tmp_path, "speculative_config:\n  decoding_type: MTP\n  max_draft_len: 3\n  num_nextn_predict_layers: 1\n"))


@pytest.mark.parametrize("line, says", [
    ("device: cuda\n", "device: TensorRT-LLM runs on the worker's GPU"),
    ("tensor_parallel_size: 2\n", "one GPU per worker"),
    ("backend: tensorrt\n", "PyTorch backend"),
    ("not_an_arg: 1\n", "not a TensorRT-LLM 1.2 LLM argument"),
    ("dtype: fp8\n", "dtype: expected auto, float16, bfloat16 or float32"),
])
def test_unsupported_llm_options_are_refused_in_one_line(tmp_path, line, says):
    with pytest.raises(ConfigError) as info:
        load_spec_file(write(tmp_path, line))
    assert says in str(info.value) and "\n" not in str(info.value)


def test_known_llm_args_are_1_2_arguments():
    assert set(LLM_ARGS) <= set(l12.TorchLlmArgs.model_fields) | {
        "tokenizer_revision", "moe_config", "scheduler_config", "peft_cache_config", "load_format",
        "enable_autotuner", "num_postprocess_workers", "garbage_collection_gen0_threshold",
        "batch_wait_timeout_ms", "torch_compile_config", "enable_min_latency", "quant_config"}


def test_the_run_options_merge_every_arm_and_refuse_disagreement(tmp_path):
    arms = [load_spec_file(str(CONFIGS / n)).spec for n in ("ngram.yaml", "eagle3.yaml", "draft_target.yaml")]
    merged = run_llm_options(load_spec_file(str(CONFIGS / "none.yaml")).llm_options, arms, where="none.yaml")
    assert merged["disable_overlap_scheduler"] is True
    assert merged["kv_cache_config"] == {"free_gpu_memory_fraction": 0.85, "enable_block_reuse": True}
    other = load_spec_file(write(tmp_path, "kv_cache_config:\n  free_gpu_memory_fraction: 0.5\n")).spec
    with pytest.raises(ConfigError, match="kv_cache_config.free_gpu_memory_fraction: 0.5 differs from 0.85"):
        run_llm_options({}, arms + [other])


def test_the_gpu_job_names_pre_staged_models_only():
    # jobs/gpu_trtllm.yaml runs with HF_HUB_OFFLINE=1: every model it names must be a URL or a path
    from batchspec.config.candidates import resolve_spec_arg
    from batchspec.config.run import load_pipeline

    job = yaml.safe_load((ROOT / "jobs" / "gpu_trtllm.yaml").read_text())
    assert job["runtime_env"]["env_vars"]["HF_HUB_OFFLINE"] == "1"
    pipeline = load_pipeline(str(ROOT / job["pipeline"]))
    choice = resolve_spec_arg(pipeline["spec"], pipeline["candidates"], "trtllm", pipeline.get("draft_model"))
    locations = [pipeline["model"]] + [a.draft_model for a in choice.arms if a.draft_model]
    assert len(locations) > 1
    assert all("://" in loc or loc.startswith("/") for loc in locations), locations
    assert pipeline["strict_speculation"] is True


def test_a_trtllm_run_gives_every_worker_the_merged_options_and_refuses_a_device():
    from batchspec.config.run import RunConfig, check_engine_options
    from batchspec.pipeline import run_llm_options as for_run

    arms = (load_spec_file(str(CONFIGS / "ngram.yaml")).spec,)
    config = RunConfig(engine="trtllm", llm_options=(("dtype", "bfloat16"),))
    assert for_run(config, arms) == {"dtype": "bfloat16", "disable_overlap_scheduler": True,
                                     "kv_cache_config": {"free_gpu_memory_fraction": 0.85}}
    assert for_run(RunConfig(engine="torch"), arms) == {}
    with pytest.raises(ConfigError, match="device: the trtllm engine runs on the worker's GPU"):
        check_engine_options(RunConfig(engine="trtllm", device="cpu"), "p.yaml")
    with pytest.raises(ConfigError, match="llm_options: device"):
        check_engine_options(RunConfig(engine="trtllm", llm_options=(("device", "cuda"),)), "p.yaml")
