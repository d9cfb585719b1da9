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
from batchspec.engine.trtllm.translate import (LLM_ARGS, LLM_ARGS_REFUSED, SPEC_KEYS, TORCH_LLM_ARGS, TRTLLM_RELEASE,
                                               decoding_config_spec, world_size)
from batchspec.errors import ConfigError
from tests.engine.trtllm.fake_tensorrt_llm import llm_args as l12

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = files("batchspec.data") / "trt_configs"
CLASSES = {"NGram": l12.NGramDecodingConfig, "Draft_Target": l12.DraftTargetDecodingConfig,
           "Eagle3": l12.Eagle3DecodingConfig, "MTP": l12.MTPDecodingConfig}


def write(tmp_path, text: str) -> str:
    path = tmp_path / "arm.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_spec_keys_are_exactly_the_1_2_fields(kind):
    # llm_args.py (1.2): DecodingBaseConfig ~24,200 and each subclass; speculative_model_dir is the alias
    internal = {"num_nextn_predict_layers_from_model_config"}  # MTP: init=False in L12, set from the model
    fields = set(CLASSES[kind].model_fields) - internal | {"speculative_model_dir"}
    assert TRTLLM_RELEASE == "1.2"
    assert CLASSES[kind].model_fields["decoding_type"].default == kind  # the tag the union is keyed on
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
    ("tensor_parallel_size: 0\n", "tensor_parallel_size: expected an integer >= 1"),
    ("backend: tensorrt\n", "PyTorch backend"),
    ("not_an_arg: 1\n", "not a TensorRT-LLM 1.2 LLM argument"),
    ("dtype: 16\n", "dtype: expected a string"),
    ("quant_config:\n  quant_algo: FP8\n", "quant_config: not a TensorRT-LLM 1.2 LLM argument (TorchLlmArgs.quant_config is a property"),
    ("orchestrator_type: ray\n", "TensorRT-LLM's Ray orchestrator would start GPU actors of its own"),
])
def test_unsupported_llm_options_are_refused_in_one_line(tmp_path, line, says):
    with pytest.raises(ConfigError) as info:
        load_spec_file(write(tmp_path, line))
    assert says in str(info.value) and "\n" not in str(info.value)


def test_known_llm_args_are_the_1_2_arguments_less_the_refused():
    # TorchLlmArgs' fields (the stand-in is pinned to the list recorded from L12), less what the
    # adapter owns; quant_config, device and speculative_model are not fields at all
    fields = set(l12.TorchLlmArgs.model_fields)
    assert set(TORCH_LLM_ARGS) == fields
    assert set(LLM_ARGS) == fields - set(LLM_ARGS_REFUSED)
    assert {"quant_config", "device", "speculative_model"} <= set(LLM_ARGS_REFUSED) - fields
    assert {"tensor_parallel_size", "pipeline_parallel_size", "moe_config", "dtype", "max_input_len"} <= set(LLM_ARGS)


def test_a_parallel_file_and_an_fp8_dtype_pass(tmp_path):
    loaded = load_spec_file(write(tmp_path, "tensor_parallel_size: 4\npipeline_parallel_size: 2\ndtype: fp8\n"))
    assert world_size(loaded.llm_options) == 8 and world_size({}) == 1


def test_the_run_options_merge_every_arm_and_refuse_disagreement(tmp_path):
    arms = [load_spec_file(str(CONFIGS / n)).spec for n in ("ngram.yaml", "eagle3.yaml", "draft_target.yaml")]
    merged = run_llm_options(load_spec_file(str(CONFIGS / "none.yaml")).llm_options, arms, where="none.yaml")
    assert merged["disable_overlap_scheduler"] is True
    assert merged["kv_cache_config"] == {"free_gpu_memory_fraction": 0.85, "enable_block_reuse": True}
    other = load_spec_file(write(tmp_path, "kv_cache_config:\n  free_gpu_memory_fraction: 0.5\n")).spec
    with pytest.raises(ConfigError, match="kv_cache_config.free_gpu_memory_fraction: 0.5 differs from 0.85"):
        run_llm_options({}, arms + [other])


@pytest.mark.parametrize("name", ["gpu_trtllm.yaml", "gpu_trtllm_70b.yaml"])
def test_the_gpu_jobs_name_pre_staged_models_only(name):
    # jobs/gpu_trtllm*.yaml run with HF_HUB_OFFLINE=1: every model they name must be a URL or a path
    from batchspec.config.candidates import resolve_spec_arg
    from batchspec.config.run import load_pipeline, validate_pipeline_file

    job = yaml.safe_load((ROOT / "jobs" / name).read_text())
    assert job["runtime_env"]["env_vars"]["HF_HUB_OFFLINE"] == "1"
    pipeline = load_pipeline(str(ROOT / job["pipeline"]))
    choice = resolve_spec_arg(pipeline["spec"], pipeline["candidates"], "trtllm", pipeline.get("draft_model"))
    locations = [pipeline["model"]] + [a.draft_model for a in choice.arms if a.draft_model]
    assert len(locations) > 1
    assert all("://" in loc or loc.startswith("/") for loc in locations), locations
    assert pipeline["strict_speculation"] is True
    validate_pipeline_file(str(ROOT / job["pipeline"]))  # the parallel sizes span the worker's GPUs


def test_the_70b_pipeline_runs_one_llm_across_four_gpus():
    from batchspec.config.run import load_pipeline

    pipeline = load_pipeline(str(ROOT / "pipelines" / "gpu_trtllm_70b.yaml"))
    assert pipeline["worker"].num_gpus == 4 == world_size(dict(pipeline["llm_options"]))
    assert "70B" in pipeline["model"]


def test_a_trtllm_run_gives_every_worker_the_merged_options_and_refuses_a_device():
    from batchspec.config.run import RunConfig, WorkerConfig, check_engine_options
    from batchspec.pipeline import run_llm_options as for_run

    arms = (load_spec_file(str(CONFIGS / "ngram.yaml")).spec,)
    config = RunConfig(engine="trtllm", llm_options=(("dtype", "bfloat16"),), worker=WorkerConfig(num_gpus=1))
    assert for_run(config, arms) == {"dtype": "bfloat16", "disable_overlap_scheduler": True,
                                     "kv_cache_config": {"free_gpu_memory_fraction": 0.85}}
    assert for_run(RunConfig(engine="torch"), arms) == {}
    with pytest.raises(ConfigError, match="device: the trtllm engine runs on the worker's GPU"):
        check_engine_options(RunConfig(engine="trtllm", device="cpu"), "p.yaml")
    with pytest.raises(ConfigError, match="llm_options: device"):
        check_engine_options(RunConfig(engine="trtllm", llm_options=(("device", "cuda"),)), "p.yaml")


@pytest.mark.parametrize("name", ["none.yaml", "ngram.yaml", "eagle3.yaml", "draft_target.yaml"])
def test_every_shipped_file_loads_as_trtllm_serve_loads_it(name):
    # trtllm-serve --config: yaml -> update_llm_args_with_extra_dict (L12 ~133,900) -> TorchLlmArgs(**),
    # the speculative_config mapping picked by its decoding_type tag (L12 SpeculativeConfig 70,485)
    data = yaml.safe_load((CONFIGS / name).read_text())
    command = {"model": "meta-llama/Llama-3.1-8B-Instruct", "max_batch_size": 64,
               "kv_cache_config": l12.KvCacheConfig(free_gpu_memory_fraction=0.9)}
    args = l12.TorchLlmArgs(**l12.update_llm_args_with_extra_dict(command, data))
    assert args.kv_cache_config.free_gpu_memory_fraction == 0.85
    if "speculative_config" in data:
        assert args.speculative_config.decoding_type == data["speculative_config"]["decoding_type"]
    if name == "eagle3.yaml":  # temperature > 0 needs it on one-model EAGLE-3 in 1.2
        assert args.speculative_config.one_model and args.speculative_config.allow_advanced_sampling


def test_draft_target_is_spelled_as_1_2_spells_it(tmp_path):
    data = {"speculative_config": {"decoding_type": "DraftTarget", "max_draft_len": 3, "speculative_model_dir": "d"}}
    with pytest.raises(Exception, match="Draft_Target"):  # the union refuses the 1.0/1.1 spelling
        l12.TorchLlmArgs(**l12.update_llm_args_with_extra_dict({"model": "m"}, data))
    with pytest.raises(ConfigError, match="spells it Draft_Target"):
        load_spec_file(write(tmp_path, yaml.safe_dump(data)))


@pytest.mark.parametrize("key, value", [("draft_len_schedule", {1: 3, 8: 1}), ("max_concurrency", 8)])
def test_drafter_settings_are_refused_on_one_model_paths(tmp_path, key, value):
    # py_executor.py (PYX ~67,657): the schedule and max_concurrency act through the drafter only
    body = {"decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model_dir": "h", key: value}
    with pytest.raises(ConfigError, match=f"{key}: TensorRT-LLM 1.2 applies it in the drafter"):
        load_spec_file(write(tmp_path, yaml.safe_dump({"speculative_config": body})))
    body["eagle3_one_model"] = False  # two-model EAGLE-3 has a drafter
    assert load_spec_file(write(tmp_path, yaml.safe_dump({"speculative_config": body}))).spec.draft_len == 3
    with pytest.raises(ConfigError, match="max_concurrency: expected an integer >= 0"):
        load_spec_file(write(tmp_path, "speculative_config:\n  decoding_type: NGram\n  max_draft_len: 3\n  max_concurrency: -1\n"))


def test_calibration_can_hand_a_fitted_schedule_to_an_arm():
    from batchspec.engine.trtllm.translate import draft_len_for, spec_options, with_draft_len_schedule

    arm = load_spec_file(str(CONFIGS / "ngram.yaml")).spec.with_draft_len(6)
    fitted = with_draft_len_schedule(arm, {8: 2, 1: 6, 32: 0})
    assert spec_options(fitted)["draft_len_schedule"] == {1: 6, 8: 2, 32: 0} and hash(fitted)
    built = l12.NGramDecodingConfig(**decoding_config_spec(fitted).kwargs)  # 1.2's validator takes it
    assert built.draft_len_schedule == {1: 6, 8: 2, 32: 0}
    # Drafter.get_draft_len_for_batch_size: the largest threshold <= the active requests
    assert [draft_len_for(built.draft_len_schedule, n, 6) for n in (1, 7, 8, 31, 32, 500)] == [6, 6, 2, 2, 0, 0]
    with pytest.raises(ConfigError, match="draft_len_schedule\\[1\\]: expected max_draft_len 6"):
        with_draft_len_schedule(arm, {1: 4, 8: 2})


@pytest.mark.parametrize("options, gpus, ok", [
    ((), 1, True), ((("tensor_parallel_size", 4),), 4, True), ((("tensor_parallel_size", 2), ("pipeline_parallel_size", 2)), 4, True),
    ((("tensor_parallel_size", 4),), 8, False), ((), 4, False), ((("tensor_parallel_size", 2),), 2.5, False), ((), 0, False),
])
def test_a_worker_runs_one_llm_across_all_its_gpus(options, gpus, ok):
    from batchspec.config.run import RunConfig, WorkerConfig
    from batchspec.pipeline import run_llm_options as for_run

    config = RunConfig(engine="trtllm", pipeline="p.yaml", llm_options=options, worker=WorkerConfig(num_gpus=gpus))
    if ok:
        assert dict(options).items() <= for_run(config, ()).items()
        return
    with pytest.raises(ConfigError) as info:
        for_run(config, ())
    message = str(info.value)
    assert message.startswith("p.yaml: llm_options: ") and f"worker.num_gpus is {gpus:g}" in message and "\n" not in message
