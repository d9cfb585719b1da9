"""The stand-in behaves as the TensorRT-LLM source it cites (SOURCES.md), independently of the
adapter: if these fail, the adapter tests prove nothing."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tests.engine.trtllm import fake_tensorrt_llm as fake
from tests.engine.trtllm.conftest import TARGET
from tests.engine.trtllm.fake_tensorrt_llm import llmapi

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
