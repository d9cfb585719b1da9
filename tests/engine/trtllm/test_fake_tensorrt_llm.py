"""The stand-in behaves as the TensorRT-LLM source it cites (SOURCES.md), independently of the
adapter: if these fail, the adapter tests prove nothing."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tests.engine.trtllm import fake_tensorrt_llm as fake
from tests.engine.trtllm.conftest import TARGET
from tests.engine.trtllm.fake_tensorrt_llm import llm_args, llmapi

EAGLE = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"


def test_memory_is_held_until_shutdown(trt):
    # each LLM takes weights + free_gpu_memory_fraction of what is still free, until shutdown()
    first = fake.LLM(TARGET)
    assert trt.gpu.free_bytes() < 0.1 * trt.gpu.total_bytes
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        fake.LLM(TARGET)
    first.shutdown()
    assert trt.gpu.free_bytes() == trt.gpu.total_bytes
    fake.LLM(TARGET).shutdown()


def test_text_prompts_get_bos_and_token_ids_pass_as_given(trt):
    # llm.py: str prompts are encoded with add_special_tokens (SamplingParams default True)
    llm = fake.LLM(TARGET)
    chat = llm.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    as_text = llm.generate_async(chat, fake.SamplingParams(max_tokens=2)).result()
    ids = llm.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=True, add_generation_prompt=True)
    as_ids = llm.generate_async(ids, fake.SamplingParams(max_tokens=2)).result()
    assert as_text.prompt_token_ids[:2] == [1, 1] and as_ids.prompt_token_ids == ids


def test_iteration_stats_are_bounded_and_drained(trt):
    # py_executor.py _append_iter_stats: pop the oldest beyond max_stats_len; get_stats drains
    llm = fake.LLM(TARGET, enable_iter_perf_stats=True, max_stats_len=10, max_batch_size=1)
    llm.generate(["abc"] * 3, fake.SamplingParams(max_tokens=8))
    kept = llm.get_stats()
    assert len(trt.audit) > len(kept) == 11 and kept[-1] == trt.audit[-1]
    assert llm.get_stats() == []


def test_one_model_eagle3_samples_greedily_unless_allowed(trt):
    # llm_args.py (1.2) DecodingBaseConfig.allow_advanced_sampling: non-greedy on 1-model paths only if set
    def run(**spec):
        llm = fake.LLM(TARGET, speculative_config=llmapi.Eagle3DecodingConfig(max_draft_len=3, speculative_model_dir=EAGLE, **spec))
        outs = llm.generate(["Once upon"] * 4, [fake.SamplingParams(max_tokens=24, temperature=0.9, seed=s) for s in range(4)])
        greedy = llm.generate(["Once upon"], fake.SamplingParams(max_tokens=24))[0].outputs[0].token_ids
        llm.shutdown()
        return [o.outputs[0].token_ids for o in outs], greedy

    forced, greedy = run()
    assert all(t == greedy for t in forced)
    allowed, greedy = run(allow_advanced_sampling=True)
    assert any(t != greedy for t in allowed)


def test_draft_latency_only_for_two_model_drafters(trt):
    # py_executor.py _update_iter_stats: iterLatencyMS from the drafter, "only for two-model mode"
    def drafted_ms(spec):
        llm = fake.LLM(TARGET, enable_iter_perf_stats=True, speculative_config=spec)
        llm.generate(["abcabc"] * 2, fake.SamplingParams(max_tokens=16))
        llm.shutdown()
        return sum(e["specDecodingStats"]["iterLatencyMS"] for e in llm.get_stats())

    assert drafted_ms(llmapi.Eagle3DecodingConfig(max_draft_len=3, speculative_model_dir=EAGLE)) == 0.0
    assert drafted_ms(llmapi.DraftTargetDecodingConfig(max_draft_len=3, speculative_model_dir="meta-llama/Llama-3.2-1B-Instruct")) > 0.0


def test_ngram_counts_what_it_proposed(trt):
    llm = fake.LLM(TARGET, enable_iter_perf_stats=True, max_batch_size=4,
                   speculative_config=llmapi.NGramDecodingConfig(max_draft_len=6, max_matching_ngram_size=3))
    outs = llm.generate(["The capital of France is", "xyz"], fake.SamplingParams(max_tokens=40))
    stats = [e["specDecodingStats"] for e in llm.get_stats()]
    steps_with_drafts = sum(s["numRequestsWithDraftTokens"] for s in stats)
    assert 0 < sum(s["numDraftTokens"] for s in stats) < 6 * steps_with_drafts  # fewer than k, sometimes
    assert sum(o.decoding_iter for o in outs) > 0


def test_mtp_draft_length_comes_from_num_nextn_predict_layers(trt):
    # llm_args.py (1.2) MTPDecodingConfig.set_max_total_draft_tokens
    assert llmapi.MTPDecodingConfig(max_draft_len=3).max_draft_len == 1
    assert llmapi.MTPDecodingConfig(num_nextn_predict_layers=3).max_draft_len == 3


def test_config_classes_refuse_unknown_keys(trt):
    with pytest.raises(ValidationError, match="decoding_type"):
        llmapi.EagleDecodingConfig(decoding_type="Eagle3", max_draft_len=3, speculative_model_dir=EAGLE)
    with pytest.raises(ValidationError, match="use_rejection_sampling"):  # a main-only field
        llmapi.Eagle3DecodingConfig(max_draft_len=3, speculative_model_dir=EAGLE, use_rejection_sampling=True)
    with pytest.raises(ValidationError, match="device"):
        fake.LLM(TARGET, device="cuda")
    with pytest.raises(TypeError):
        fake.SamplingParams(max_tokens=4, not_a_field=1)


def test_builds_take_simulated_time(monkeypatch):
    st = fake.install(monkeypatch, build_seconds=30.0)
    before = st.clock()
    fake.LLM(TARGET).shutdown()
    assert st.clock() - before == pytest.approx(30.0) and st.builds == 1


# ---- the stand-in's classes against the field lists recorded from the source ----------------------
# Recorded from L12 (SOURCES.md: tensorrt_llm/llmapi/llm_args.py, index copy 7019226376): every
# field of BaseLlmArgs (80,910) + TorchLlmArgs (~117,600) with its default, in declaration
# order; "<Cls>" a default_factory, REQUIRED a field without a default. Facts, not code.
REQUIRED = "<required>"
TORCH_LLM_ARGS = {
    "model": REQUIRED, "tokenizer": None, "tokenizer_mode": "auto", "custom_tokenizer": None,
    "skip_tokenizer_init": False, "trust_remote_code": False, "tensor_parallel_size": 1, "dtype": "auto",
    "revision": None, "tokenizer_revision": None, "model_kwargs": None, "pipeline_parallel_size": 1,
    "context_parallel_size": 1, "gpus_per_node": None, "moe_cluster_parallel_size": None,
    "moe_tensor_parallel_size": None, "moe_expert_parallel_size": None, "enable_attention_dp": False,
    "enable_lm_head_tp_in_adp": False, "pp_partition": None, "cp_config": None, "load_format": "LoadFormat.AUTO",
    "enable_lora": False, "lora_config": None, "kv_cache_config": "<KvCacheConfig>", "enable_chunked_prefill": False,
    "guided_decoding_backend": None, "batched_logits_processor": None, "iter_stats_max_iterations": None,
    "request_stats_max_iterations": None, "peft_cache_config": None, "scheduler_config": "<SchedulerConfig>",
    "cache_transceiver_config": None, "sparse_attention_config": None, "speculative_config": None,
    "max_batch_size": 2048, "max_input_len": 1024, "max_seq_len": None, "max_beam_width": 1, "max_num_tokens": 8192,
    "gather_generation_logits": False, "num_postprocess_workers": 0, "postprocess_tokenizer_dir": None,
    "reasoning_parser": None, "decoding_config": None, "mpi_session": None, "otlp_traces_endpoint": None,
    "return_perf_metrics": False, "perf_metrics_max_requests": 0, "orchestrator_type": None, "env_overrides": None,
    # TorchLlmArgs' own (load_format and backend override BaseLlmArgs')
    "garbage_collection_gen0_threshold": 20000, "cuda_graph_config": "<CudaGraphConfig>", "attention_dp_config": None,
    "disable_overlap_scheduler": False, "moe_config": "<MoeConfig>", "nvfp4_gemm_config": "<Nvfp4GemmConfig>",
    "attn_backend": "TRTLLM", "sampler_type": "auto", "sampler_force_async_worker": False,
    "enable_iter_perf_stats": False, "enable_iter_req_stats": False, "print_iter_log": False,
    "batch_wait_timeout_ms": 0, "batch_wait_timeout_iters": 0, "batch_wait_max_tokens_ratio": 0,
    "torch_compile_config": None, "enable_autotuner": True, "enable_layerwise_nvtx_marker": False,
    "enable_min_latency": False, "stream_interval": 1, "force_dynamic_quantization": False, "allreduce_strategy": "AUTO",
    "checkpoint_loader": None, "checkpoint_format": None, "kv_connector_config": None, "mm_encoder_only": False,
    "ray_worker_extension_cls": None, "ray_placement_config": None, "enable_sleep": False,
    "use_cute_dsl_blockscaling_mm": False, "use_cute_dsl_blockscaling_bmm": False, "disable_flashinfer_sampling": False,
    "max_stats_len": 1000, "layer_wise_benchmarks_config": "<LayerwiseBenchmarksConfig>", "backend": "pytorch",
}
KV_CACHE_CONFIG = {  # L12 KvCacheConfig (~71,300)
    "enable_block_reuse": True, "max_tokens": None, "max_attention_window": None, "sink_token_length": None,
    "free_gpu_memory_fraction": 0.9, "host_cache_size": None, "onboard_blocks": True, "cross_kv_cache_fraction": None,
    "secondary_offload_min_priority": None, "event_buffer_max_size": 0, "attention_dp_events_gather_period_ms": 5,
    "enable_partial_reuse": True, "copy_on_partial_reuse": True, "use_uvm": False, "max_gpu_total_bytes": 0,
    "dtype": "auto", "mamba_ssm_cache_dtype": "auto", "tokens_per_block": 32, "use_kv_cache_manager_v2": False,
    "max_util_for_resume": 0.95,
}
CUDA_GRAPH_CONFIG = {"batch_sizes": None, "max_batch_size": 0, "enable_padding": False}  # L12 CudaGraphConfig (~3,700)


def _defaults(cls) -> dict:
    out = {}
    for name, f in cls.model_fields.items():
        if f.default_factory is not None:
            out[name] = f"<{f.default_factory.__name__}>"
        elif f.is_required():
            out[name] = REQUIRED
        else:
            out[name] = str(f.default) if isinstance(f.default, llm_args.LoadFormat) else f.default
    return out


@pytest.mark.parametrize("cls, recorded", [(llmapi.TorchLlmArgs, TORCH_LLM_ARGS), (llmapi.KvCacheConfig, KV_CACHE_CONFIG),
                                           (llmapi.CudaGraphConfig, CUDA_GRAPH_CONFIG)])
def test_fields_and_defaults_are_the_recorded_ones(cls, recorded):
    assert list(_defaults(cls)) == list(recorded)  # same fields, same order
    assert _defaults(cls) == recorded


def test_real_validators_and_refusals():
    # KvCacheConfig.free_gpu_memory_fraction: default 0.9, bounded to [0, 1]
    assert llmapi.KvCacheConfig().free_gpu_memory_fraction == 0.9
    with pytest.raises(ValidationError, match="free_gpu_memory_fraction"):
        llmapi.KvCacheConfig(free_gpu_memory_fraction=1.5)
    # CudaGraphConfig: the default expands to 1-32, 64, 128; max_batch_size must be max(batch_sizes)
    assert llmapi.CudaGraphConfig().batch_sizes == list(range(1, 33)) + [64, 128]
    assert llmapi.CudaGraphConfig(max_batch_size=16).batch_sizes == list(range(1, 17))
    assert llmapi.CudaGraphConfig(max_batch_size=300).batch_sizes[-3:] == [128, 256, 300]
    assert llmapi.CudaGraphConfig(batch_sizes=[8, 1, 4]).max_batch_size == 8
    with pytest.raises(ValidationError, match="max_batch_size must equal max"):
        llmapi.CudaGraphConfig(batch_sizes=[1, 2, 4], max_batch_size=8)
    args = llmapi.TorchLlmArgs(model="m", dtype="fp8", max_input_len=None)
    assert (args.dtype, args.max_input_len) == ("fp8", 1024)  # a free string; None means the default
    with pytest.raises(ValidationError, match="quant_config"):  # a property, not a field
        llmapi.TorchLlmArgs(model="m", quant_config={"quant_algo": "FP8"})
    with pytest.raises(ValidationError, match="Invalid LoadFormat"):
        llmapi.TorchLlmArgs(model="m", load_format="safetensors")
    # speculative_config from a mapping: the union is keyed on decoding_type's tag
    spec = {"max_draft_len": 3, "speculative_model_dir": "d"}
    assert type(llmapi.TorchLlmArgs(model="m", speculative_config={"decoding_type": "Draft_Target", **spec}).speculative_config) \
        is llmapi.DraftTargetDecodingConfig
    with pytest.raises(ValidationError, match="Draft_Target"):
        llmapi.TorchLlmArgs(model="m", speculative_config={"decoding_type": "DraftTarget", **spec})
    eagle = llmapi.TorchLlmArgs(model="m", speculative_config={"decoding_type": "Eagle", **spec}).speculative_config
    assert type(eagle) is llmapi.Eagle3DecodingConfig  # Eagle is taken as Eagle3 on the PyTorch backend


def test_an_llm_spans_its_world_of_gpus(monkeypatch):
    st = fake.install(monkeypatch, gpu_bytes=80 * fake.GIB, gpus=4)
    llm = fake.LLM(TARGET, tensor_parallel_size=2, pipeline_parallel_size=2)
    held = [g.total_bytes - g.free_bytes() for g in st.gpus]
    assert len(set(held)) == 1 and held[0] > 0  # every GPU of the world holds its share
    llm.shutdown()
    assert all(g.free_bytes() == g.total_bytes for g in st.gpus)
    with pytest.raises(RuntimeError, match="= 8 GPUs, but this process sees 4"):
        fake.LLM(TARGET, tensor_parallel_size=8)
