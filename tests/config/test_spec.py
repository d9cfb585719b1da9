"""The speculative-settings language: shipped files validate, broken ones name file and key."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest

from batchspec.config.candidates import (
    default_candidates_path,
    load_candidates,
    resolve_spec_arg,
)
from batchspec.config.spec import load_spec_file
from batchspec.config.validate import validate_spec_file as validate_file
from batchspec.engine.base import FrozenMap, SpecConfig, freeze, thaw
from batchspec.engine.trtllm.translate import llm_options, spec_options
from batchspec.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(glob.glob(str(ROOT / "trt_configs" / "*.yaml")) + glob.glob(str(ROOT / "trt_configs" / "candidates" / "*.yaml")))


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def error_of(fn, *args, **kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


# ---- shipped files ----------------------------------------------------------------------------


def test_the_shipped_files_are_all_there():
    names = {Path(p).relative_to(ROOT / "trt_configs").as_posix() for p in SHIPPED}
    assert {"eagle3.yaml", "draft_target.yaml", "ngram.yaml", "none.yaml",
            "candidates/torch_default.yaml", "candidates/trtllm_default.yaml"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: Path(p).name)
def test_every_shipped_file_validates(path):
    summary = validate_file(path)
    assert summary.startswith(path + ": ")


def test_shipped_option_files_translate_as_documented():
    ngram = load_spec_file(ROOT / "trt_configs" / "ngram.yaml")
    assert (ngram.spec.method, ngram.spec.draft_len, ngram.spec.ngram_size, ngram.spec.draft_model) == ("ngram", 4, 3, None)
    assert ngram.llm_options["disable_overlap_scheduler"] is True
    assert spec_options(ngram.spec) == {"is_keep_all": True, "is_use_oldest": True, "is_public_pool": False}
    eagle = load_spec_file(ROOT / "trt_configs" / "eagle3.yaml").spec
    assert (eagle.method, eagle.draft_model) == ("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
    draft = load_spec_file(ROOT / "trt_configs" / "draft_target.yaml")
    assert draft.spec.method == "draft_target" and draft.llm_options["disable_overlap_scheduler"] is True
    none = load_spec_file(ROOT / "trt_configs" / "none.yaml")
    assert none.spec.method == "none" and llm_options(none.spec)["kv_cache_config"]["free_gpu_memory_fraction"] == 0.85


def test_torch_default_candidates_are_ngram_suffix_and_the_packaged_draft():
    arms = load_candidates(default_candidates_path("torch"))
    assert [a.label for a in arms] == ["ngram:k=2", "ngram:k=4", "ngram:k=6", "ngram:k=8",
                                       "suffix:k=4", "suffix:k=8", "suffix:k=16",
                                       "draft_target:k=2", "draft_target:k=4", "draft_target:k=6"]
    assert {a.draft_model for a in arms if a.method == "draft_target"} == {"qwen2.5-coder-0.5b"}
    assert all(a.source.endswith(("trt_configs/ngram.yaml", "trt_configs/draft_target.yaml", "trt_configs/suffix.yaml"))
               for a in arms)


def test_the_suffix_file_is_an_arm_for_the_torch_engine_and_refused_for_trtllm_in_one_line():
    path = str(ROOT / "trt_configs" / "suffix.yaml")
    spec = resolve_spec_arg(path, None, "torch", None).fixed
    assert (spec.method, spec.draft_len, spec.spec_factor, spec.min_token_prob, spec.options) == ("suffix", 8, 1.0, 0.1, ())
    message = error_of(resolve_spec_arg, path, None, "trtllm", None)
    assert message.startswith(f"{path}: decoding_type Suffix: TensorRT-LLM 1.2 has no suffix drafting")
    assert "NGram with is_public_pool: true" in message and message.endswith("use --engine torch")


@pytest.mark.parametrize("body, key, expectation", [
    ("  max_spec_factor: 0\n", "speculative_config.max_spec_factor", "expected a number > 0, got 0"),
    ("  min_token_prob: 1.5\n", "speculative_config.min_token_prob", "expected a number in [0, 1], got 1.5"),
    ("  max_matching_ngram_size: 3\n", "speculative_config.max_matching_ngram_size", "unknown field for decoding_type Suffix"),
])
def test_broken_suffix_settings_name_the_key(tmp_path, body, key, expectation):
    path = write(tmp_path, "s.yaml", "speculative_config:\n  decoding_type: Suffix\n  max_draft_len: 4\n" + body)
    assert f"{path}: {key}: {expectation}" in error_of(load_spec_file, path)


# ---- broken option files ---------------------------------------------------------------------


def test_bad_yaml_names_file_and_line(tmp_path):
    path = write(tmp_path, "x.yaml", "speculative_config:\n  decoding_type: NGram\n  max_draft_len: [4\n")
    message = error_of(load_spec_file, path)
    assert message.startswith(f"{path}:4: invalid YAML: expected ',' or ']'")
    assert message.endswith("(while parsing a flow sequence that starts at line 3)")
    path = write(tmp_path, "y.yaml", "a: 1\n  b: 2\n")
    assert error_of(load_spec_file, path) == f"{path}:2: invalid YAML: mapping values are not allowed here"


@pytest.mark.parametrize(
    "body, key, expectation",
    [
        ("decoding_type: Medusa\n  max_draft_len: 4", "speculative_config.decoding_type", "expected one of Eagle3, Draft_Target, NGram, MTP, Suffix, got 'Medusa'"),
        ("decoding_type: NGram\n  max_draft_len: 0", "speculative_config.max_draft_len", "expected an integer >= 1, got 0"),
        ("decoding_type: NGram\n  max_draft_len: -2", "speculative_config.max_draft_len", "expected an integer >= 1, got -2"),
        ("decoding_type: NGram\n  max_draft_len: four", "speculative_config.max_draft_len", "expected an integer >= 1, got 'four' (str)"),
        ("decoding_type: NGram\n  max_draft_len: true", "speculative_config.max_draft_len", "expected an integer >= 1, got True"),
        ("decoding_type: NGram", "speculative_config.max_draft_len", "the key is required"),
        ("decoding_type: Draft_Target\n  max_draft_len: 4", "speculative_config.speculative_model_dir", "Draft_Target needs a draft model"),
        ("decoding_type: DraftTarget\n  max_draft_len: 4", "speculative_config.decoding_type", "got 'DraftTarget' (str) (TensorRT-LLM 1.2 spells it Draft_Target)"),
        ("decoding_type: Eagle3\n  max_draft_len: 3", "speculative_config.speculative_model_dir", "Eagle3 needs the location of its EAGLE-3 head"),
        ("decoding_type: NGram\n  max_draft_len: 4\n  prompt_lookup_max: 3", "speculative_config.prompt_lookup_max", "unknown field for decoding_type NGram (valid: "),
        ("decoding_type: NGram\n  max_draft_len: 4\n  speculative_model_dir: x", "speculative_config.speculative_model_dir", "NGram needs no draft model"),
        ("decoding_type: NGram\n  max_draft_len: 4\n  max_matching_ngram_size: 0", "speculative_config.max_matching_ngram_size", "expected an integer >= 1, got 0"),
        ("decoding_type: NGram\n  max_draft_len: 4\n  is_keep_all: 'yes'", "speculative_config.is_keep_all", "expected true or false"),
        ("decoding_type: Draft_Target\n  max_draft_len: 4\n  speculative_model: a\n  speculative_model_dir: b", "speculative_config.speculative_model", "not both"),
        ("decoding_type: NGram\n  max_draft_len: 4\n  draft_len_schedule: {1: 3, 8: 2}", "speculative_config.draft_len_schedule[1]", "expected max_draft_len 4 at batch size 1 (TensorRT-LLM 1.2 requires it), got 3"),
    ],
)
def test_broken_speculative_config_names_the_key(tmp_path, body, key, expectation):
    path = write(tmp_path, "x.yaml", f"speculative_config:\n  {body}\n")
    message = error_of(load_spec_file, path)
    assert message.startswith(f"{path}: {key}: ")
    assert expectation in message


def test_unknown_speculative_key_lists_the_valid_ones(tmp_path):
    path = write(tmp_path, "x.yaml", "speculative_config:\n  decoding_type: NGram\n  max_draft_len: 4\n  ngram_size: 3\n")
    message = error_of(load_spec_file, path)
    assert "max_matching_ngram_size" in message and "is_public_pool" in message


@pytest.mark.parametrize(
    "body, key, expectation",
    [
        ("max_batch_size: 0", "max_batch_size", "expected an integer >= 1, got 0"),
        ("disable_overlap_scheduler: 1", "disable_overlap_scheduler", "expected true or false, got 1"),
        ("kv_cache_config:\n  free_gpu_memory_fraction: 1.5", "kv_cache_config.free_gpu_memory_fraction", "expected a number in (0, 1], got 1.5"),
        ("kv_cache_config: 0.9", "kv_cache_config", "expected a mapping, got 0.9"),
        ("cuda_graph_config:\n  batch_sizes: [1, 0]", "cuda_graph_config.batch_sizes[1]", "expected an integer >= 1, got 0"),
        ("model: meta-llama/Llama-3.1-8B-Instruct", "model", "pass it with --model"),
    ],
)
def test_broken_llm_options_name_the_key(tmp_path, body, key, expectation):
    path = write(tmp_path, "x.yaml", body + "\n")
    message = error_of(load_spec_file, path)
    assert message.startswith(f"{path}: {key}: ") and expectation in message


def test_unknown_top_level_llm_args_pass_through(tmp_path):
    path = write(tmp_path, "x.yaml", "enable_chunked_prefill: true\nattn_backend: TRTLLM\n")
    loaded = load_spec_file(path)
    assert loaded.spec.method == "none"
    assert loaded.llm_options == {"enable_chunked_prefill": True, "attn_backend": "TRTLLM"}


def test_missing_file_and_non_mapping(tmp_path):
    missing = str(tmp_path / "nope.yaml")
    assert error_of(load_spec_file, missing) == f"{missing}: file not found"
    path = write(tmp_path, "list.yaml", "- 1\n- 2\n")
    assert "expected a mapping of TensorRT-LLM LLM arguments" in error_of(load_spec_file, path)


def test_draft_model_on_the_command_line_supplies_or_replaces_the_draft(tmp_path):
    path = write(tmp_path, "dt.yaml", "speculative_config:\n  decoding_type: Draft_Target\n  max_draft_len: 3\n")
    assert load_spec_file(path, draft_model="qwen2.5-coder-0.5b").spec.draft_model == "qwen2.5-coder-0.5b"
    shipped = ROOT / "trt_configs" / "draft_target.yaml"
    assert load_spec_file(shipped, draft_model="/models/d").spec.draft_model == "/models/d"


def test_mtp_length_may_come_from_num_nextn_predict_layers(tmp_path):
    path = write(tmp_path, "mtp.yaml", "speculative_config:\n  decoding_type: MTP\n  num_nextn_predict_layers: 2\n")
    spec = load_spec_file(path).spec
    assert (spec.method, spec.draft_len) == ("mtp", 2)


def test_options_are_hashable_and_thaw_back(tmp_path):
    path = write(tmp_path, "x.yaml", (
        "speculative_config:\n  decoding_type: NGram\n  max_draft_len: 4\n  draft_len_schedule: {1: 4, 8: 2}\n"
        "kv_cache_config:\n  free_gpu_memory_fraction: 0.5\ncuda_graph_config:\n  batch_sizes: [1, 2]\n"
    ))
    spec = load_spec_file(path).spec
    assert isinstance(hash(spec), int)
    assert spec_options(spec) == {"draft_len_schedule": {1: 4, 8: 2}}
    assert llm_options(spec) == {"kv_cache_config": {"free_gpu_memory_fraction": 0.5}, "cuda_graph_config": {"batch_sizes": [1, 2]}}
    nested = {"a": [[0, 1], [0, 2]], "b": {"c": [1]}}
    assert isinstance(freeze(nested), FrozenMap) and thaw(freeze(nested)) == nested


# ---- candidates files ------------------------------------------------------------------------


def candidates_tree(tmp_path: Path, entries: str) -> str:
    write(tmp_path, "ngram.yaml", "speculative_config:\n  decoding_type: NGram\n  max_draft_len: 4\n")
    write(tmp_path, "dt.yaml", "speculative_config:\n  decoding_type: Draft_Target\n  max_draft_len: 4\n")
    write(tmp_path, "eagle.yaml", "speculative_config:\n  decoding_type: Eagle3\n  max_draft_len: 3\n  speculative_model_dir: head\n")
    write(tmp_path, "none.yaml", "kv_cache_config:\n  enable_block_reuse: true\n")
    return write(tmp_path, "cands/c.yaml", "candidates:\n" + entries)


def test_candidates_expand_draft_lengths_relative_to_the_file(tmp_path):
    path = candidates_tree(tmp_path, "  - config: ../ngram.yaml\n    max_draft_len: [2, 4, 2]\n  - config: ../ngram.yaml\n")
    arms = load_candidates(path)
    assert [a.label for a in arms] == ["ngram:k=2", "ngram:k=4"]  # duplicates dropped, order kept
    assert arms[0].source == str(tmp_path / "ngram.yaml")


@pytest.mark.parametrize(
    "entries, key, expectation",
    [
        ("  - config: ../ngram.yaml\n    max_draft_len: [2, 0]\n", "candidates[0].max_draft_len", "expected an integer >= 1, got 0"),
        ("  - config: ../ngram.yaml\n    draft_len: [2]\n", "candidates[0].draft_len", "unknown key"),
        ("  - max_draft_len: [2]\n", "candidates[0].config", "expected the path of a TensorRT-LLM option file"),
        ("  - config: ../none.yaml\n", "candidates[0].config", "calibration adds 'none' itself"),
        ("  - config: ../ngram.yaml\n    speculative_model_dir: d\n", "candidates[0].speculative_model_dir", "ngram takes no draft model"),
        ("  - 3\n", "candidates[0]", "expected a mapping, got 3"),
    ],
)
def test_broken_candidates_name_the_key(tmp_path, entries, key, expectation):
    path = candidates_tree(tmp_path, entries)
    message = error_of(load_candidates, path)
    assert message.startswith(f"{path}: {key}") and expectation in message


def test_candidate_pointing_at_a_broken_option_file_names_that_file(tmp_path):
    path = candidates_tree(tmp_path, "  - config: ../bad.yaml\n")
    bad = write(tmp_path, "bad.yaml", "speculative_config:\n  decoding_type: NGram\n  max_draft_len: 0\n")
    assert error_of(load_candidates, path).startswith(f"{bad}: speculative_config.max_draft_len: ")


def test_empty_candidates_list(tmp_path):
    path = write(tmp_path, "c.yaml", "candidates: []\n")
    assert "expected a non-empty list" in error_of(load_candidates, path)


# ---- --spec resolution and engine capability -------------------------------------------------


def test_spec_none_and_auto():
    none = resolve_spec_arg("none", None, "torch", None)
    assert (none.arms, none.calibrate, none.fixed) == ((), False, None)
    auto = resolve_spec_arg("auto", None, "torch", None)
    assert auto.calibrate and len(auto.arms) == 10 and all(a.method != "none" for a in auto.arms)
    assert auto.source == default_candidates_path("torch")


def test_spec_file_is_exactly_that_arm():
    path = str(ROOT / "trt_configs" / "ngram.yaml")
    choice = resolve_spec_arg(path, None, "torch", None)
    assert not choice.calibrate and choice.fixed.label == "ngram:k=4" and choice.fixed.source == path
    none = resolve_spec_arg(str(ROOT / "trt_configs" / "none.yaml"), None, "torch", None)
    assert none.fixed is None and not none.calibrate


def test_spec_file_that_is_a_candidates_file_calibrates(tmp_path):
    path = candidates_tree(tmp_path, "  - config: ../ngram.yaml\n    max_draft_len: [2, 6]\n")
    choice = resolve_spec_arg(path, None, "torch", None)
    assert choice.calibrate and [a.label for a in choice.arms] == ["ngram:k=2", "ngram:k=6"]


def test_auto_drops_draft_target_without_a_draft_and_says_why(tmp_path):
    path = candidates_tree(tmp_path, "  - config: ../ngram.yaml\n  - config: ../dt.yaml\n    max_draft_len: [2, 4]\n")
    choice = resolve_spec_arg("auto", path, "torch", None)
    assert [a.label for a in choice.arms] == ["ngram:k=4"]
    assert len(choice.dropped) == 2 and "no draft model configured" in choice.dropped[0]
    with_draft = resolve_spec_arg("auto", path, "torch", "/models/draft")
    assert [a.label for a in with_draft.arms] == ["ngram:k=4", "draft_target:k=2", "draft_target:k=4"]
    assert {a.draft_model for a in with_draft.arms[1:]} == {"/models/draft"} and not with_draft.dropped


def test_explicit_draft_target_file_without_draft_is_an_error(tmp_path):
    candidates_tree(tmp_path, "  - config: ../ngram.yaml\n")
    path = str(tmp_path / "dt.yaml")
    assert "needs a draft model" in error_of(resolve_spec_arg, path, None, "torch", None)
    assert resolve_spec_arg(path, None, "torch", "d").fixed.draft_model == "d"


def test_cli_draft_model_overrides_the_candidates_draft():
    choice = resolve_spec_arg("auto", None, "torch", "smollm2-135m")
    assert {a.draft_model for a in choice.arms if a.method == "draft_target"} == {"smollm2-135m"}


def test_eagle3_runs_on_both_engines_and_mtp_on_trtllm_only(tmp_path):
    path = str(ROOT / "trt_configs" / "eagle3.yaml")
    assert resolve_spec_arg(path, None, "torch", None).fixed.method == "eagle3"
    assert resolve_spec_arg(path, None, "trtllm", None).fixed.method == "eagle3"
    write(tmp_path, "mtp.yaml", "speculative_config:\n  decoding_type: MTP\n  max_draft_len: 1\n")
    path = candidates_tree(tmp_path, "  - config: ../mtp.yaml\n")
    assert error_of(resolve_spec_arg, "auto", path, "torch", None) == (
        f"{tmp_path / 'mtp.yaml'}: decoding_type MTP is not supported by the torch engine "
        "(supported: NGram, Draft_Target, Eagle3, Suffix); use --engine trtllm")


def test_a_draft_model_that_is_an_eagle3_head_makes_the_draft_target_arms_eagle3(tmp_path):
    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 32000}')
    arms = resolve_spec_arg("auto", None, "torch", str(head)).arms
    assert [a.label for a in arms if a.draft_model == str(head)] == ["eagle3:k=2", "eagle3:k=4", "eagle3:k=6"]
    assert not any(a.method == "draft_target" for a in arms)
    fixed = resolve_spec_arg(str(ROOT / "trt_configs" / "draft_target.yaml"), None, "torch", str(head)).fixed
    assert (fixed.method, fixed.draft_model) == ("eagle3", str(head))
    plain_model = resolve_spec_arg("auto", None, "torch", str(tmp_path)).arms  # a folder without an EAGLE-3 config
    assert {a.method for a in plain_model if a.draft_model == str(tmp_path)} == {"draft_target"}


def test_unknown_engine(tmp_path):
    assert "--engine: expected one of torch, trtllm" in error_of(resolve_spec_arg, "none", None, "vllm", None)


def test_spec_config_stays_engine_neutral():
    spec = load_spec_file(ROOT / "trt_configs" / "ngram.yaml").spec
    assert isinstance(spec, SpecConfig) and spec.with_draft_len(6).label == "ngram:k=6"
