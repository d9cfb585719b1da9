"""The stand-in behaves as the TensorRT-LLM source it cites (SOURCES.md), independently of the
adapter: if these fail, the adapter tests prove nothing."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tests.engine.trtllm import fake_tensorrt_llm as fake
from tests.engine.trtllm.conftest import TARGET
from tests.engine.trtllm.fake_tensorrt_llm import llm_args, llmapi

EAGLE = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"


def gone(llm) -> None:
    """Shut an LLM down and query its GPUs until its worker process has given the memory back."""
    llm.shutdown()
    for gpu in fake.state().gpus:
        for _ in range(fake.state().release_queries + 1):
            gpu.mem_get_info()


def test_memory_is_held_until_shutdown_and_back_only_some_queries_later(trt):
    # each LLM takes weights + free_gpu_memory_fraction of what is still free, until shutdown();
    # SOURCES.md "Shutdown": the worker process that holds it exits after shutdown() returns
    first = fake.LLM(TARGET)
    assert trt.gpu.free_bytes() < 0.1 * trt.gpu.total_bytes
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        fake.LLM(TARGET)
    first.shutdown()
    seen = [fake.mem_get_info()[0] for _ in range(trt.release_queries + 1)]
    assert seen[:-1] == [seen[0]] * trt.release_queries and seen[0] < 0.1 * trt.gpu.total_bytes
    assert seen[-1] == trt.gpu.total_bytes
    gone(fake.LLM(TARGET))


def test_a_build_right_after_shutdown_sees_the_memory_still_held(trt):
    fake.LLM(TARGET).shutdown()
    with pytest.raises(RuntimeError, match="CUDA out of memory"):  # its KV-cache sizing is a query too
        fake.LLM(TARGET)


def test_get_stats_waits_for_silence_then_latches_until_the_next_submission(trt):
    # SOURCES.md "Stats": IterationResult.get_results reads until no entry arrived for `timeout`
    # seconds, then returns [] until generate_async marks it undone
    llm = fake.LLM(TARGET, enable_iter_perf_stats=True, max_batch_size=2)
    assert llm.get_stats(timeout=2) == []  # nothing before the first request
    futures = [llm.generate_async(p, fake.SamplingParams(max_tokens=40)) for p in ("abc", "def", "ghi")]
    began = trt.clock()
    entries = llm.get_stats(timeout=2)
    assert all(f.done for f in futures)  # it waited for every request submitted
    assert len(entries) == len(trt.audit) and trt.clock() - began > 2
    futures[0].result()
    assert llm.get_stats(timeout=2) == []  # latched: no generate_async since
    llm.generate_async("jkl", fake.SamplingParams(max_tokens=4)).result()
    assert llm.get_stats(timeout=0) == []  # the last iterations are not relayed yet
    assert llm.get_stats(timeout=2) == []  # latched by the call before
    llm.generate_async("mno", fake.SamplingParams(max_tokens=4))
    later = llm.get_stats(timeout=2)
    assert entries + later == trt.audit  # every entry, in order, once


def test_a_short_timeout_reads_only_what_has_arrived(trt):
    llm = fake.LLM(TARGET, enable_iter_perf_stats=True, max_batch_size=1)
    first = llm.generate_async("abc", fake.SamplingParams(max_tokens=60, ignore_eos=True))
    llm.generate_async("def", fake.SamplingParams(max_tokens=60, ignore_eos=True))
    first.result()
    now = trt.clock()
    early = llm.get_stats(timeout=0)
    assert trt.clock() == now and 0 < len(early) < len(trt.audit)  # no wait; the last 0.2-0.4 s still on the way
    assert early == trt.audit[:len(early)]


def test_stop_strings_are_token_suffixes_cut_from_token_ids_not_from_the_stats(trt):
    # SOURCES.md "Stop strings": stop words are tokenized and matched as token suffixes in the
    # sampler; the LLM API cuts them from token_ids; numGeneratedTokens still counts them
    llm = fake.LLM(TARGET, enable_iter_perf_stats=True, enable_iter_req_stats=True)
    free = llm.generate_async("abc", fake.SamplingParams(max_tokens=40, ignore_eos=True)).result().outputs[0]
    stop = llm.tokenizer.decode(free.token_ids[5:7])
    out = llm.generate_async("abc", fake.SamplingParams(max_tokens=40, stop=stop, ignore_eos=True)).result().outputs[0]
    cut = len(llm.tokenizer.encode(stop, add_special_tokens=False))
    first = free.text.find(stop)
    assert (out.finish_reason, out.stop_reason, out.text) == ("stop", stop, free.text[:first])
    counted = [r for e in llm.get_stats(timeout=2) for r in e.get("requestStats", ())]
    assert counted[-1]["numGeneratedTokens"] == len(out.token_ids) + cut


def test_a_stop_string_seen_only_in_the_text_cuts_the_text_and_token_ids_run_on(trt):
    llm = fake.LLM(TARGET)
    free = llm.generate_async("abc", fake.SamplingParams(max_tokens=30, ignore_eos=True)).result().outputs[0]
    stop = free.text[4:6]
    params = fake.SamplingParams(max_tokens=30, stop=stop, ignore_eos=True)
    params._setup(llm.tokenizer)
    params._stop_word_ids = [[0, 0]]  # a tokenization the sampler never meets
    out = llm.generate_async("abc", params).result().outputs[0]
    assert out.token_ids == free.token_ids and out.text == free.text[:free.text.find(stop)]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)


def test_length_rules_cap_max_tokens_and_refuse_long_prompts(trt):
    # SOURCES.md "Lengths": max_tokens capped at max_seq_len - prompt (a warning); a prompt longer
    # than max_num_tokens refused by generate_async; one with no room refused by its result()
    llm = fake.LLM(TARGET, max_seq_len=64, max_num_tokens=48, enable_iter_perf_stats=True, enable_iter_req_stats=True)
    capped = llm.generate_async([5] * 40, fake.SamplingParams(max_tokens=100, ignore_eos=True)).result().outputs[0]
    assert (capped.finish_reason, len(capped.token_ids)) == ("length", 24)
    with pytest.raises(ValueError, match="should not exceed max_num_tokens"):
        llm.generate_async([5] * 49, fake.SamplingParams(max_tokens=4))
    gone(llm)
    chunked = fake.LLM(TARGET, max_seq_len=48, enable_chunked_prefill=True)
    refused = chunked.generate_async([5] * 48, fake.SamplingParams(max_tokens=4))
    with pytest.raises(fake.llm.RequestError, match="default_max_tokens"):
        refused.result()


def test_one_generator_for_every_request_and_no_seed(trt):
    # SOURCES.md "Seeds": 1.2's TorchSampler draws every request from one generator seeded 42
    def run(seeds):
        llm = fake.LLM(TARGET)
        outs = llm.generate(["Once upon"] * 3, [fake.SamplingParams(max_tokens=16, temperature=1.0, seed=s) for s in seeds])
        gone(llm)
        return [o.outputs[0].token_ids for o in outs]

    a, b = run([1, 1, 1]), run([7, 8, 9])
    assert a == b  # the seed changes nothing
    assert a[0] != a[1]  # the same prompt and seed, a different draw


def test_the_end_token_is_counted_in_num_generated_tokens(trt):
    llm = fake.LLM(TARGET, enable_iter_perf_stats=True, enable_iter_req_stats=True)
    outs = llm.generate([chr(97 + i) * 3 for i in range(8)], fake.SamplingParams(max_tokens=30))
    ended = [o for o in outs if o.outputs[0].finish_reason == "stop"]
    assert ended
    last = {}
    for e in llm.get_stats(timeout=2):
        for r in e.get("requestStats", ()):
            last[r["id"]] = r["numGeneratedTokens"]
    counts = [last[k] for k in sorted(last)]
    assert all(n == len(o.outputs[0].token_ids) + (o.outputs[0].finish_reason == "stop") for n, o in zip(counts, outs))


def test_without_a_tokenizer_no_request_gets_its_end_id(trt):
    llm = fake.LLM(TARGET, skip_tokenizer_init=True)
    with pytest.raises(ValueError, match="tokenizer is required to reset end_id"):
        llm.generate_async([5, 6], fake.SamplingParams(max_tokens=4))


def test_text_prompts_get_bos_and_token_ids_pass_as_given(trt):
    # llm.py: str prompts are encoded with add_special_tokens (SamplingParams default True)
    llm = fake.LLM(TARGET)
    chat = llm.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    as_text = llm.generate_async(chat, fake.SamplingParams(max_tokens=2)).result()
    ids = llm.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=True, add_generation_prompt=True)
    as_ids = llm.generate_async(ids, fake.SamplingParams(max_tokens=2)).result()
    assert as_text.prompt_token_ids[:2] == [1, 1] and as_ids.prompt_token_ids == ids


def test_iteration_stats_are_bounded_between_the_workers_polls(trt):
    # py_executor.py _append_iter_stats: pop the oldest beyond max_stats_len; the worker takes them
    # every 0.2 s, so only more than max_stats_len + 1 iterations within one poll lose any
    llm = fake.LLM(TARGET, enable_iter_perf_stats=True, max_stats_len=10, max_batch_size=1)
    llm.generate(["abc"] * 3, fake.SamplingParams(max_tokens=30))
    kept = llm.get_stats()
    assert len(trt.audit) > len(kept) and kept[-1] == trt.audit[-1]
    gone(llm)
    llm = fake.LLM(TARGET, enable_iter_perf_stats=True, max_batch_size=1)
    before = len(trt.audit)
    llm.generate(["abc"] * 3, fake.SamplingParams(max_tokens=30))
    assert llm.get_stats() == trt.audit[before:]


def test_one_model_eagle3_samples_greedily_unless_allowed(trt):
    # llm_args.py (1.2) DecodingBaseConfig.allow_advanced_sampling: non-greedy on 1-model paths only if set
    def run(**spec):
        llm = fake.LLM(TARGET, speculative_config=llmapi.Eagle3DecodingConfig(max_draft_len=3, speculative_model_dir=EAGLE, **spec))
        outs = llm.generate(["Once upon"] * 4, [fake.SamplingParams(max_tokens=24, temperature=0.9, seed=s) for s in range(4)])
        greedy = llm.generate(["Once upon"], fake.SamplingParams(max_tokens=24))[0].outputs[0].token_ids
        gone(llm)
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
        ms = sum(e["specDecodingStats"]["iterLatencyMS"] for e in llm.get_stats())
        gone(llm)
        return ms

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
    gone(llm)
    assert all(g.free_bytes() == g.total_bytes for g in st.gpus)
    with pytest.raises(RuntimeError, match="= 8 GPUs, but this process sees 4"):
        fake.LLM(TARGET, tensor_parallel_size=8)
