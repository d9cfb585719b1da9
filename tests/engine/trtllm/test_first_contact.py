"""Issue 13: the defects a first real GPU run would have hit, each driven through the adapter over
the stand-in `tensorrt_llm` (fake_tensorrt_llm/, which cites the TensorRT-LLM source it follows).
Every test here failed against the adapter as it was before the fix (see the commit messages)."""

from __future__ import annotations

import pytest

from batchspec.config.spec import load_spec_file, run_llm_options
from batchspec.engine.base import NO_SPEC, Request, SamplingParams, SpecConfig
from batchspec.engine.trtllm import translate
from batchspec.engine.trtllm.adapter import TrtllmEngine
from batchspec.errors import BatchspecError
from tests.engine.trtllm import fake_tensorrt_llm as fake
from tests.engine.trtllm.conftest import TARGET
from tests.engine.trtllm.fake_tensorrt_llm import llmapi

from importlib.resources import files

CONFIGS = files("batchspec.data") / "trt_configs"
PROMPTS = ["The capital of France is", "def fib(n):", "abc abc abc abc", "Once upon a time"]


def arm(name: str) -> SpecConfig:
    return load_spec_file(str(CONFIGS / name)).spec


def engine_for(*arms: SpecConfig, base: dict | None = None, model: str = TARGET) -> TrtllmEngine:
    """An engine built like the pipeline builds it: every arm with the run's merged LLM options."""
    return TrtllmEngine(model, run_llm_options(base or {}, arms))


def rows(n: int = 4, max_tokens: int = 24, **params) -> list[Request]:
    return [Request(f"r{i}", PROMPTS[i % len(PROMPTS)], params=SamplingParams(max_tokens=max_tokens, **params)) for i in range(n)]


def spec_totals(entries) -> tuple[int, int]:
    spec = [e["specDecodingStats"] for e in entries if "specDecodingStats" in e]
    return sum(s["numDraftTokens"] for s in spec), sum(s["numAcceptedTokens"] for s in spec)


# 1. py_executor / KvCacheConfig: each LLM holds weights + free_gpu_memory_fraction of free memory
#    until shutdown() (fake_tensorrt_llm/_sim.py SimulatedGPU; SOURCES.md). One live LLM per worker.
def test_one_live_llm_per_worker_and_every_arm_builds(trt):
    arms = [arm("ngram.yaml"), arm("eagle3.yaml"), arm("draft_target.yaml")]
    engine = engine_for(*arms)
    for spec in [NO_SPEC, *arms, NO_SPEC]:
        result = engine.generate(rows(), spec, 4)
        assert [c.error for c in result.completions] == [None] * 4, spec.label
        assert len(trt.live) == 1
    assert trt.max_live == 1
    engine.close()
    assert not trt.live
    seen = [trt.gpu.mem_get_info()[0] for _ in range(trt.release_queries + 1)]  # back once its process exits
    assert seen[0] < trt.gpu.total_bytes == seen[-1]


# 1 (memory planning): DraftTarget's fit is planned with nothing else resident.
def test_draft_target_plan_sees_an_empty_gpu(trt, tmp_path):
    target, draft = tmp_path / "target", tmp_path / "draft"
    for folder, layers, size in ((target, 32, 16 * fake.GIB), (draft, 16, 2 * fake.GIB)):
        folder.mkdir()
        (folder / "config.json").write_text(
            f'{{"num_hidden_layers": {layers}, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096}}')
        with open(folder / "model.safetensors", "wb") as f:  # sparse: only its size matters
            f.truncate(size)
    engine = TrtllmEngine(str(target), {"max_seq_len": 4096})
    engine.generate(rows(2), NO_SPEC, 8)
    spec = SpecConfig("draft_target", 4, draft_model=str(draft))
    result = engine.generate(rows(2), spec, 8)
    assert [c.error for c in result.completions] == [None, None]
    assert (engine.builds[-1].ran_as, engine.builds[-1].reason) == ("draft_target:k=4", None)
    engine.close()


# 2. py_executor.py _append_iter_stats (PYX 46,036): at most max_stats_len (+1) iterations are kept,
#    oldest dropped; max_stats_len defaults to 1000 (AD 39,709).
def test_iteration_stats_cover_every_iteration_of_a_long_call(trt):
    engine = engine_for(arm("ngram.yaml"))
    requests = rows(96, max_tokens=100)
    result = engine.generate(requests, arm("ngram.yaml"), 1)  # batch 1: iterations add up per row
    assert len(trt.audit) > 1001
    stats = engine.last_iteration_stats
    assert stats.iterations == len(trt.audit) == sum(c.target_steps + 1 for c in result.completions)
    assert (stats.draft_tokens, stats.accepted_tokens) == spec_totals(trt.audit)
    assert stats.accepted_tokens == result.accepted_tokens  # totals checked against per-request counts
    engine.close()


# 3. llm_args.py (1.2) DecodingBaseConfig.allow_advanced_sampling (L12 ~24,200): without it a
#    one-model path (Eagle3 one-model, MTP) decodes temperature > 0 greedily.
def test_sampled_rows_under_one_model_eagle3_are_sampled(trt):
    engine = engine_for(arm("eagle3.yaml"))
    greedy = [c.token_ids for c in engine.generate(rows(), arm("eagle3.yaml"), 4).completions]
    sampled = [c.token_ids for c in engine.generate(rows(temperature=0.9, seed=5), arm("eagle3.yaml"), 4).completions]
    assert sampled != greedy
    assert all(b.speculative_config.allow_advanced_sampling for b in trt.built)
    engine.close()


def test_a_file_that_forbids_advanced_sampling_refuses_sampled_rows(trt, tmp_path):
    path = tmp_path / "eagle3_greedy.yaml"
    path.write_text((CONFIGS / "eagle3.yaml").read_text() + "\n")
    text = path.read_text().replace("  allow_advanced_sampling: true", "  allow_advanced_sampling: false")
    path.write_text(text)
    spec = load_spec_file(str(path)).spec
    engine = engine_for(spec)
    with pytest.raises(BatchspecError) as info:
        engine.generate(rows(temperature=0.7), spec, 4)
    assert "allow_advanced_sampling" in str(info.value) and "\n" not in str(info.value)
    engine.close()


# 4. py_executor.py _update_iter_stats (PYX ~45,000): specDecodingStats.iterLatencyMS is the
#    drafter's latency "only for two-model mode"; one-model arms report 0.
def test_no_draft_verify_split_where_it_was_not_measured(trt):
    engine = engine_for(arm("eagle3.yaml"), arm("draft_target.yaml"))
    eagle = engine.generate(rows(), arm("eagle3.yaml"), 4)
    assert "draft_s" in eagle.caveats and eagle.timing.draft_s == 0.0
    two_model = engine.generate(rows(), arm("draft_target.yaml"), 4)
    assert "draft_s" not in two_model.caveats and two_model.timing.draft_s > 0.0
    engine.close()


# 5. llm.py: a str prompt is encoded with add_special_tokens=True (SamplingParams default, SP),
#    so a chat template rendered to text (which already holds BOS) would carry BOS twice.
def test_chat_rows_carry_one_bos(trt):
    engine = TrtllmEngine(TARGET)
    messages = ({"role": "user", "content": "Name three colours."},)
    c = engine.generate([Request("chat", messages=messages, params=SamplingParams(max_tokens=8))], NO_SPEC, 1).completions[0]
    template = fake._sim.FakeTokenizer().apply_chat_template(list(messages), tokenize=True, add_generation_prompt=True)
    assert c.error is None and c.prompt_tokens == len(template)
    engine.close()


def test_a_prompt_row_goes_through_the_chat_template_under_chat_and_as_text_under_raw(trt):
    """prompt_format (batchspec.parse): chat makes a prompt one user message, which the adapter
    templates before the LLM, as Ray Data LLM's chat-template stage does; raw leaves the text to
    TensorRT-LLM's own tokenizer."""
    import pyarrow as pa

    from batchspec.parse import RowDefaults, parse_rows

    engine = TrtllmEngine(TARGET)
    text = "Name three colours."
    chat, raw = (parse_rows(pa.table({"prompt": [text]}), [fmt], RowDefaults(8, 0.0, 1.0, 0, fmt))[0].request for fmt in ("chat", "raw"))
    a, b = engine.generate([chat, raw], NO_SPEC, 2).completions
    tokenizer = fake._sim.FakeTokenizer()
    templated = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True)
    assert (a.error, b.error) == (None, None)
    assert a.prompt_tokens == len(templated) and b.prompt_tokens == len(tokenizer.encode(text)) < a.prompt_tokens
    engine.close()


# 6. Like for like: every arm is built with the run's non-speculative LLM options (TorchLlmArgs
#    rejects unknown keys, so `device` is refused before anything is built).
def test_every_arm_gets_the_same_llm_options(trt):
    arms = [arm("ngram.yaml"), arm("eagle3.yaml")]
    engine = engine_for(*arms, base={"dtype": "bfloat16", "kv_cache_config": {"enable_block_reuse": True}})
    for spec in [NO_SPEC, *arms]:
        engine.generate(rows(2), spec, 4)
    plain = [b.model_dump(exclude={"speculative_config"}) for b in trt.built]
    assert plain[0] == plain[1] == plain[2]
    assert trt.built[0].dtype == "bfloat16" and trt.built[0].disable_overlap_scheduler is True
    assert trt.built[0].kv_cache_config.free_gpu_memory_fraction == 0.85
    engine.close()


def test_an_arm_built_differently_from_the_run_is_refused(trt):
    engine = TrtllmEngine(TARGET, {"kv_cache_config": {"free_gpu_memory_fraction": 0.5}, "disable_overlap_scheduler": True})
    with pytest.raises(BatchspecError, match="free_gpu_memory_fraction"):
        engine.generate(rows(1), arm("ngram.yaml"), 1)
    engine.close()


def test_create_engine_passes_dtype_and_refuses_a_device(trt):
    from batchspec.engine.factory import create_engine

    engine = create_engine("trtllm", TARGET, dtype="bfloat16", llm_options={"disable_overlap_scheduler": True})
    engine.generate(rows(1), NO_SPEC, 1)
    assert trt.built[0].dtype == "bfloat16" and trt.built[0].disable_overlap_scheduler is True
    engine.close()
    with pytest.raises(BatchspecError, match="device"):
        create_engine("trtllm", TARGET, device="cpu")


# 7. llm_args.py (1.2) MTPDecodingConfig.set_max_total_draft_tokens (L12 50,372): max_draft_len is
#    overwritten by num_nextn_predict_layers (default 1).
def test_mtp_runs_the_draft_length_it_is_labelled_with(trt, tmp_path):
    trt.models["org/mtp-target"] = fake.FakeModel(16 * fake.GIB, 64 * 1024, 8192, mtp_layers=3)
    path = tmp_path / "mtp.yaml"
    path.write_text("speculative_config:\n  decoding_type: MTP\n  max_draft_len: 3\n")
    spec = load_spec_file(str(path)).spec
    engine = engine_for(spec, model="org/mtp-target")
    result = engine.generate(rows(), spec, 4)
    assert spec.label == "mtp:k=3" and trt.built[0].speculative_config.num_nextn_predict_layers == 3
    with_drafts = sum(e["specDecodingStats"]["numRequestsWithDraftTokens"] for e in trt.audit)
    assert spec_totals(trt.audit)[0] == 3 * with_drafts
    assert result.draft_tokens == spec_totals(trt.audit)[0]
    engine.close()


# 11. py_executor.py _update_iter_stats: numDraftTokens counts the drafts really proposed; NGram
#     proposes fewer than max_draft_len where the lookup finds less.
def test_ngram_draft_counts_are_what_was_proposed(trt):
    engine = engine_for(arm("ngram.yaml"))
    result = engine.generate(rows(8, max_tokens=48), arm("ngram.yaml").with_draft_len(6), 4)
    drafted, accepted = spec_totals(trt.audit)
    assert result.draft_tokens == drafted < 6 * result.target_steps
    assert result.accepted_tokens == accepted and result.acceptance_rate == pytest.approx(accepted / drafted)
    assert "draft_tokens" not in result.caveats
    engine.close()


def test_draft_counts_are_labelled_estimates_when_stats_are_incomplete(trt, monkeypatch):
    monkeypatch.setattr(fake.LLM, "get_stats", lambda self, timeout=2.0: [])  # get_stats timed out
    engine = engine_for(arm("ngram.yaml"))
    result = engine.generate(rows(4), arm("ngram.yaml"), 4)
    assert "estimate" in result.caveats["draft_tokens"]
    assert result.draft_tokens == 4 * result.target_steps  # the upper bound, labelled as such
    engine.close()


# 12. llm_args.py (1.2) EagleDecodingConfig.decoding_type is Literal["Eagle"] (L12 ~33,900): the old
#     fallback EagleDecodingConfig(decoding_type="Eagle3") raised; and return_perf_metrics was unread.
def test_no_eagle_fallback_and_no_unread_perf_metrics(trt, monkeypatch):
    assert "return_perf_metrics" not in translate.sampling_kwargs(SamplingParams(max_tokens=4, temperature=0.5))
    monkeypatch.delattr(llmapi, "Eagle3DecodingConfig")
    engine = engine_for(arm("eagle3.yaml"))
    with pytest.raises(BatchspecError) as info:
        engine.generate(rows(1), arm("eagle3.yaml"), 1)
    assert "Eagle3DecodingConfig" in str(info.value) and "1.2" in str(info.value) and "\n" not in str(info.value)
    engine.close()


def test_a_shard_worker_builds_its_engine_with_the_run_options(trt):
    # the pipeline's create_engine call (workers.ShardWorker.start) passes the run's LLM options
    import types

    from batchspec.config.run import WorkerConfig
    from batchspec.parse import RowDefaults
    from batchspec.workers import ShardWorker

    options = run_llm_options({"dtype": "bfloat16"}, [arm("ngram.yaml")])
    job = types.SimpleNamespace(engine="trtllm", model=TARGET, draft_model=None, dtype="bfloat16", device=None,
                                worker=WorkerConfig(torch_threads=1), storage_options=(),
                                llm_options=tuple(options.items()), defaults=RowDefaults(8, 0.0, 1.0, 0))
    worker = ShardWorker(job)
    assert worker.start() == TARGET
    worker.engine.generate(rows(1), NO_SPEC, 2)  # "none" is built with the run's options too
    assert trt.built[0].disable_overlap_scheduler is True and trt.built[0].dtype == "bfloat16"
    assert trt.built[0].kv_cache_config.free_gpu_memory_fraction == 0.85
    worker.engine.close()
