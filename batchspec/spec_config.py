"""The speculative-settings language: TensorRT-LLM option files and batchspec candidates files.

This module owns reading and validating the files that say how to speculate, once, at the edge,
and turning them into engine-neutral `SpecConfig` arms. It knows nothing about models, Ray or
timing; engines receive `SpecConfig` values and trust them.

Two kinds of file
-----------------
1. A TensorRT-LLM LLM-API option file (`trt_configs/*.yaml`): exactly the YAML that
   `trtllm-serve --config` / `--extra_llm_api_options` and `trtllm-bench` read, so a user can take
   it straight to those tools. Its `speculative_config:` block is the arm::

       speculative_config:
         decoding_type: NGram          # Eagle3 | DraftTarget | NGram | MTP
         max_draft_len: 4              # integer >= 1
         max_matching_ngram_size: 3    # NGram only
       disable_overlap_scheduler: true # every other top-level key is an LLM argument

   A file without `speculative_config` is "no speculation" (method none). Keys of
   `speculative_config` are checked against the fields of TensorRT-LLM's decoding-config classes
   (tensorrt_llm/llmapi/llm_args.py: DecodingBaseConfig, EagleDecodingConfig / Eagle3DecodingConfig,
   NGramDecodingConfig, DraftTargetDecodingConfig, MTPDecodingConfig), which reject unknown fields;
   an unknown key here is an error that lists the valid ones. Top-level LLM arguments that
   batchspec reads (max_batch_size, max_num_tokens, max_seq_len, disable_overlap_scheduler,
   kv_cache_config, cuda_graph_config, ...) are type-checked; others pass through untouched to
   `tensorrt_llm.LLM`, which validates them itself (the torch engine ignores them).
   `speculative_model_dir` and `speculative_model` are the same field (1.2 accepts both); the draft
   location may be a local folder, an fsspec URL, a Hugging Face id or a packaged-model name
   (resolved later by `batchspec.models.resolve_model`).

2. A batchspec candidates file (`trt_configs/candidates/*.yaml`): the calibration arms. The option
   files must stay valid for trtllm-serve, which takes one `max_draft_len`, so the list of draft
   lengths to try lives here instead::

       candidates:
         - config: ../ngram.yaml           # path relative to this file
           max_draft_len: [2, 4, 6, 8]     # optional: one arm per value (default: the file's)
         - config: ../draft_target.yaml
           max_draft_len: [2, 4, 6]
           speculative_model_dir: qwen2.5-coder-0.5b   # optional: replaces the file's draft

   "none" is never listed: calibration always adds it itself. A candidate file that mixes a list
   of draft lengths with a `draft_len_schedule` is rejected (the schedule pins max_draft_len).

`--spec` on the command line
----------------------------
`resolve_spec_arg` turns `--spec auto|none|FILE` into a `SpecChoice`: `none` never speculates;
`auto` calibrates over the engine's default candidates file (or `--candidates`); a FILE that is an
option file runs exactly that arm with no calibration; a FILE that is a candidates file calibrates
over its arms. `--draft-model` on the command line overrides the draft of every DraftTarget arm.
Under `auto` (and a candidates FILE) a DraftTarget arm with no draft model anywhere is dropped and
the reason recorded in `SpecChoice.dropped`, because "speculate if it pays" must still run without
a draft; an explicit option FILE without its draft is an error instead, because the user asked for
exactly that arm. Engines support different methods (`ENGINE_METHODS`); an arm the chosen engine
cannot run is an error naming the file and the engine to use instead.

Error messages are one line: "FILE: KEY: expected ..., got ...".
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec
import yaml

from batchspec.engine.base import SpecConfig
from batchspec.errors import ConfigError

# decoding_type (as written in TensorRT-LLM option files) -> batchspec method name
DECODING_TYPES = {"Eagle3": "eagle3", "DraftTarget": "draft_target", "NGram": "ngram", "MTP": "mtp"}
METHOD_TO_DECODING_TYPE = {method: name for name, method in DECODING_TYPES.items()}

# Which methods each engine runs; "none" is always possible.
ENGINE_METHODS = {
    "torch": ("none", "ngram", "draft_target"),
    "trtllm": ("none", "ngram", "draft_target", "eagle3", "mtp"),
}

# speculative_config fields accepted per decoding_type, from tensorrt_llm/llmapi/llm_args.py
# (NVIDIA/TensorRT-LLM, read at commit 0004396720054fd8e205cbf616f21f0b57c6b412, plus the 1.2-era
# names `speculative_model_dir` and `acceptance_window`).
_BASE_KEYS = (
    "decoding_type", "max_draft_len", "max_total_draft_tokens", "speculative_model",
    "speculative_model_dir", "max_concurrency", "draft_len_schedule", "load_format",
    "acceptance_window", "acceptance_rate_window_size", "acceptance_rate_threshold",
    "use_rejection_sampling", "allow_advanced_sampling", "advanced_sampling_mode", "enable_penalty",
)
_EAGLE_KEYS = (
    "eagle_choices", "greedy_sampling", "posterior_threshold", "use_dynamic_tree",
    "dynamic_tree_max_topK", "num_eagle_layers", "max_non_leaves_per_layer", "eagle3_one_model",
    "eagle3_layers_to_capture", "eagle3_model_arch", "sa_config", "use_sa_spec", "sa_spec_threshold",
)
_NGRAM_KEYS = ("max_matching_ngram_size", "is_keep_all", "is_use_oldest", "is_public_pool")
_MTP_KEYS = (
    "num_nextn_predict_layers", "use_relaxed_acceptance_for_thinking", "relaxed_topk",
    "relaxed_delta", "use_mtp_vanilla", "mtp_eagle_one_model", "use_dynamic_tree",
    "dynamic_tree_max_topK", "sa_config", "use_sa_spec", "sa_spec_threshold",
    "begin_thinking_phase_token", "end_thinking_phase_token",
)
SPEC_KEYS = {
    "NGram": _BASE_KEYS + _NGRAM_KEYS,
    "DraftTarget": _BASE_KEYS,
    "Eagle3": _BASE_KEYS + _EAGLE_KEYS,
    "MTP": _BASE_KEYS + _MTP_KEYS,
}
NGRAM_SIZE_DEFAULT = 2  # NGramDecodingConfig.max_matching_ngram_size default in llm_args.py

# Fields lifted into SpecConfig's own attributes; everything else goes to SpecConfig.options.
_LIFTED = ("decoding_type", "max_draft_len", "speculative_model", "speculative_model_dir",
           "max_matching_ngram_size")
SPEC_PREFIX = "speculative_config."

CANDIDATE_KEYS = ("config", "max_draft_len", "speculative_model_dir", "speculative_model")
CANDIDATES_DIR = Path(__file__).resolve().parent.parent / "trt_configs" / "candidates"


class FrozenMap(tuple):
    """A YAML mapping kept hashable inside a frozen SpecConfig: a tuple of (key, value) pairs."""


def freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return FrozenMap((k, freeze(v)) for k, v in value.items())
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """The inverse of `freeze`: mappings back to dicts, sequences back to lists."""
    if isinstance(value, FrozenMap):
        return {k: thaw(v) for k, v in value}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class SpecFile:
    """A validated TensorRT-LLM option file: its arm and its other (non-speculative) LLM args."""

    path: str
    spec: SpecConfig
    llm_options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SpecChoice:
    """What `--spec` resolved to. `arms` never holds "none" (calibration adds it); with
    `calibrate` false the run uses `arms[0]`, or no speculation when `arms` is empty."""

    arms: tuple[SpecConfig, ...]
    calibrate: bool
    source: str | None = None
    dropped: tuple[str, ...] = ()  # one line per arm left out, with the reason

    @property
    def fixed(self) -> SpecConfig | None:
        """The one arm to run without calibration (None means no speculation)."""
        assert not self.calibrate
        return self.arms[0] if self.arms else None


# ---------------------------------------------------------------------------------------------
# Reading


def read_yaml(path: str) -> Any:
    """Parse one YAML file through fsspec; bad YAML is one line with the file and the line."""
    try:
        with fsspec.open(path, "r", encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f":{mark.line + 1}" if mark is not None else ""
        context = exc.context_mark and exc.problem_mark and exc.context_mark.line != exc.problem_mark.line
        since = f" ({exc.context} that starts at line {exc.context_mark.line + 1})" if context else ""
        raise ConfigError(f"{path}{where}: invalid YAML: {exc.problem or exc.context}{since}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {' '.join(str(exc).split())}") from None


def is_candidates_file(data: Any) -> bool:
    return isinstance(data, dict) and "candidates" in data


def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})" if isinstance(value, str) else repr(value)


def _int(path: str, key: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{path}: {key}: expected an integer >= {minimum}, got {_describe(value)}")
    return value


def _bool(path: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{path}: {key}: expected true or false, got {_describe(value)}")
    return value


def _fraction(path: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ConfigError(f"{path}: {key}: expected a number in (0, 1], got {_describe(value)}")
    return float(value)


def _text(path: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{path}: {key}: expected a non-empty string (a model location), got {_describe(value)}")
    return value


def _mapping(path: str, key: str, value: Any) -> dict:
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: {key}: expected a mapping, got {_describe(value)}")
    return value


# ---------------------------------------------------------------------------------------------
# TensorRT-LLM option files

# Top-level LLM arguments batchspec reads or that commonly go wrong, with their checks.
_TOP_INTS = {"max_batch_size": 1, "max_num_tokens": 1, "max_seq_len": 1, "max_input_len": 1,
             "tensor_parallel_size": 1, "pipeline_parallel_size": 1}
_TOP_BOOLS = ("disable_overlap_scheduler", "enable_iter_perf_stats", "enable_chunked_prefill",
              "trust_remote_code", "enable_attention_dp", "print_iter_log")


def _check_llm_options(path: str, options: dict) -> None:
    for key, minimum in _TOP_INTS.items():
        if key in options:
            _int(path, key, options[key], minimum)
    for key in _TOP_BOOLS:
        if key in options:
            _bool(path, key, options[key])
    if "model" in options:
        raise ConfigError(f"{path}: model: the target model is not part of an option file; pass it with --model")
    if "kv_cache_config" in options:
        kv = _mapping(path, "kv_cache_config", options["kv_cache_config"])
        if "free_gpu_memory_fraction" in kv:
            _fraction(path, "kv_cache_config.free_gpu_memory_fraction", kv["free_gpu_memory_fraction"])
        if "enable_block_reuse" in kv:
            _bool(path, "kv_cache_config.enable_block_reuse", kv["enable_block_reuse"])
        if kv.get("max_tokens") is not None:
            _int(path, "kv_cache_config.max_tokens", kv["max_tokens"], 1)
    if options.get("cuda_graph_config") is not None:
        cg = _mapping(path, "cuda_graph_config", options["cuda_graph_config"])
        if "max_batch_size" in cg:
            _int(path, "cuda_graph_config.max_batch_size", cg["max_batch_size"], 0)
        if "enable_padding" in cg:
            _bool(path, "cuda_graph_config.enable_padding", cg["enable_padding"])
        sizes = cg.get("batch_sizes")
        if sizes is not None and (not isinstance(sizes, list) or not sizes):
            raise ConfigError(f"{path}: cuda_graph_config.batch_sizes: expected a non-empty list of integers, got {_describe(sizes)}")
        for i, size in enumerate(sizes or ()):
            _int(path, f"cuda_graph_config.batch_sizes[{i}]", size, 1)


def _check_schedule(path: str, schedule: Any, draft_len: int) -> None:
    key = SPEC_PREFIX + "draft_len_schedule"
    _mapping(path, key, schedule)
    if not schedule:
        raise ConfigError(f"{path}: {key}: expected a non-empty mapping of batch size -> draft length")
    for batch, k in schedule.items():
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ConfigError(f"{path}: {key}: expected batch-size keys >= 1, got {_describe(batch)}")
        _int(path, f"{key}[{batch}]", k, 0)
        if k > draft_len:
            raise ConfigError(f"{path}: {key}[{batch}]: expected a draft length <= max_draft_len {draft_len}, got {k}")
    smallest = min(schedule)
    if schedule[smallest] != draft_len:
        raise ConfigError(f"{path}: {key}[{smallest}]: expected max_draft_len {draft_len} at the smallest batch size, got {schedule[smallest]}")


def parse_spec_section(path: str, section: Any, *, require_draft: bool = True) -> SpecConfig:
    """Validate one `speculative_config` mapping and translate it into a SpecConfig.

    With `require_draft` false a DraftTarget arm may lack its draft model (its `draft_model` is
    then None); callers that allow that must supply or drop it."""
    section = _mapping(path, "speculative_config", section)
    kind = section.get("decoding_type")
    if kind not in DECODING_TYPES:
        raise ConfigError(
            f"{path}: speculative_config.decoding_type: expected one of {', '.join(DECODING_TYPES)}, got {_describe(kind)}"
        )
    allowed = SPEC_KEYS[kind]
    for key in section:
        if key not in allowed:
            raise ConfigError(
                f"{path}: speculative_config.{key}: unknown field for decoding_type {kind} (valid: {', '.join(sorted(allowed))})"
            )
    draft_len = _draft_len(path, kind, section)
    draft_model = _draft_model(path, section)
    ngram_size = NGRAM_SIZE_DEFAULT
    if kind == "NGram":
        if draft_model is not None:
            raise ConfigError(f"{path}: speculative_config.speculative_model_dir: NGram needs no draft model; remove it")
        if "max_matching_ngram_size" in section:
            ngram_size = _int(path, SPEC_PREFIX + "max_matching_ngram_size", section["max_matching_ngram_size"], 1)
        for key in ("is_keep_all", "is_use_oldest", "is_public_pool"):
            if key in section:
                _bool(path, SPEC_PREFIX + key, section[key])
    if kind == "Eagle3":
        if draft_model is None:
            raise ConfigError(f"{path}: speculative_config.speculative_model_dir: Eagle3 needs the location of its EAGLE-3 head, got none")
        if "eagle3_one_model" in section:
            _bool(path, SPEC_PREFIX + "eagle3_one_model", section["eagle3_one_model"])
    if kind == "DraftTarget" and draft_model is None and require_draft:
        raise ConfigError(
            f"{path}: speculative_config.speculative_model_dir: DraftTarget needs a draft model with the target's tokenizer; set it here or pass --draft-model"
        )
    if section.get("draft_len_schedule") is not None:
        _check_schedule(path, section["draft_len_schedule"], draft_len)
    options = tuple((SPEC_PREFIX + k, freeze(v)) for k, v in section.items() if k not in _LIFTED)
    return SpecConfig(
        method=DECODING_TYPES[kind], draft_len=draft_len, draft_model=draft_model,
        ngram_size=ngram_size, options=options, source=path,
    )


def _draft_len(path: str, kind: str, section: dict) -> int:
    if "max_draft_len" in section:
        return _int(path, SPEC_PREFIX + "max_draft_len", section["max_draft_len"], 1)
    if kind == "MTP" and "num_nextn_predict_layers" in section:  # MTP's older spelling of the length
        return _int(path, SPEC_PREFIX + "num_nextn_predict_layers", section["num_nextn_predict_layers"], 1)
    raise ConfigError(f"{path}: speculative_config.max_draft_len: expected an integer >= 1, got nothing (the key is required)")


def _draft_model(path: str, section: dict) -> str | None:
    given = [k for k in ("speculative_model_dir", "speculative_model") if section.get(k) is not None]
    if len(given) == 2:
        raise ConfigError(f"{path}: speculative_config.speculative_model: give speculative_model_dir or speculative_model, not both")
    return _text(path, SPEC_PREFIX + given[0], section[given[0]]) if given else None


def _parse_options_file(path: str, data: Any, *, require_draft: bool) -> SpecFile:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of TensorRT-LLM LLM arguments at the top level, got {_describe(data)}")
    if is_candidates_file(data):
        raise ConfigError(f"{path}: this is a candidates file; expected a TensorRT-LLM option file here")
    llm_options = {k: v for k, v in data.items() if k != "speculative_config"}
    _check_llm_options(path, llm_options)
    section = data.get("speculative_config")
    if section is None:
        spec = SpecConfig(options=_llm_option_pairs(llm_options), source=path)
    else:
        spec = parse_spec_section(path, section, require_draft=require_draft)
        spec = dataclasses.replace(spec, options=spec.options + _llm_option_pairs(llm_options))
    return SpecFile(path=path, spec=spec, llm_options=llm_options)


def _llm_option_pairs(llm_options: dict) -> tuple[tuple[str, Any], ...]:
    return tuple((k, freeze(v)) for k, v in llm_options.items())


def load_spec_file(path: str | os.PathLike, *, draft_model: str | None = None) -> SpecFile:
    """Load and validate one TensorRT-LLM option file. `draft_model` (from `--draft-model`)
    replaces the draft of a DraftTarget arm before the file's own draft is required."""
    path = str(path)
    data = read_yaml(path)
    loaded = _parse_options_file(path, data, require_draft=draft_model is None)
    if draft_model is not None and loaded.spec.method == "draft_target":
        loaded = dataclasses.replace(loaded, spec=dataclasses.replace(loaded.spec, draft_model=draft_model))
    return loaded


# ---------------------------------------------------------------------------------------------
# What SpecConfig.options holds, split back apart for the TensorRT-LLM adapter


def spec_options(spec: SpecConfig) -> dict[str, Any]:
    """The speculative_config fields not lifted into SpecConfig's attributes, as plain values."""
    return {k[len(SPEC_PREFIX):]: thaw(v) for k, v in spec.options if k.startswith(SPEC_PREFIX)}


def llm_options(spec: SpecConfig) -> dict[str, Any]:
    """The top-level LLM arguments of the arm's source file, as plain values."""
    return {k: thaw(v) for k, v in spec.options if not k.startswith(SPEC_PREFIX)}


# ---------------------------------------------------------------------------------------------
# Candidates files


def _relative(base: str, target: str) -> str:
    """`target` as written in the candidates file at `base`: relative paths are relative to it."""
    protocol, _ = fsspec.core.split_protocol(target)
    if protocol or posixpath.isabs(target) or os.path.isabs(target):
        return target
    base_protocol, base_path = fsspec.core.split_protocol(base)
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(base_path), target))
    return f"{base_protocol}://{joined}" if base_protocol else joined


def _entry_lengths(path: str, key: str, value: Any) -> list[int]:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise ConfigError(f"{path}: {key}: expected an integer >= 1 or a non-empty list of them, got []")
    lengths = [_int(path, key, v, 1) for v in values]
    return sorted(set(lengths), key=lengths.index)


def load_candidates(path: str | os.PathLike) -> list[SpecConfig]:
    """The calibration arms of a candidates file, in file order, without "none" and without
    duplicates. DraftTarget arms may come back with `draft_model` None (see `resolve_spec_arg`)."""
    path = str(path)
    data = read_yaml(path)
    if not is_candidates_file(data):
        raise ConfigError(f"{path}: candidates: expected a candidates file with a top-level 'candidates' list")
    extra = sorted(set(data) - {"candidates"})
    if extra:
        raise ConfigError(f"{path}: {extra[0]}: unknown key (a candidates file holds only 'candidates')")
    entries = data["candidates"]
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{path}: candidates: expected a non-empty list of {{config: FILE, max_draft_len: [...]}}, got {_describe(entries)}")
    arms: list[SpecConfig] = []
    for i, entry in enumerate(entries):
        for arm in _entry_arms(path, f"candidates[{i}]", entry):
            if arm not in arms:
                arms.append(arm)
    return arms


def _entry_arms(path: str, where: str, entry: Any) -> list[SpecConfig]:
    entry = _mapping(path, where, entry)
    for key in entry:
        if key not in CANDIDATE_KEYS:
            raise ConfigError(f"{path}: {where}.{key}: unknown key (valid: {', '.join(CANDIDATE_KEYS)})")
    if "config" not in entry:
        raise ConfigError(f"{path}: {where}.config: expected the path of a TensorRT-LLM option file, got nothing")
    config = _relative(path, _text(path, f"{where}.config", entry["config"]))
    data = read_yaml(config)
    base = _parse_options_file(config, data, require_draft=False).spec
    if base.method == "none":
        raise ConfigError(f"{path}: {where}.config: {config} has no speculative_config; calibration adds 'none' itself, remove this entry")
    draft = None
    for key in ("speculative_model_dir", "speculative_model"):
        if key in entry:
            draft = _text(path, f"{where}.{key}", entry[key])
    if draft is not None:
        if base.method not in ("draft_target", "eagle3"):
            raise ConfigError(f"{path}: {where}.speculative_model_dir: {base.method} takes no draft model")
        base = dataclasses.replace(base, draft_model=draft)
    if "max_draft_len" not in entry:
        return [base]
    lengths = _entry_lengths(path, f"{where}.max_draft_len", entry["max_draft_len"])
    if any(k == SPEC_PREFIX + "draft_len_schedule" for k, _ in base.options) and lengths != [base.draft_len]:
        raise ConfigError(f"{path}: {where}.max_draft_len: {config} sets draft_len_schedule, which pins max_draft_len {base.draft_len}; list only that length or drop the schedule")
    return [base.with_draft_len(k) for k in lengths]


# ---------------------------------------------------------------------------------------------
# --spec and engines


def check_engine_supports(spec: SpecConfig, engine_name: str) -> None:
    """Raise ConfigError when `engine_name` cannot run `spec`'s method."""
    supported = ENGINE_METHODS.get(engine_name)
    if supported is None:
        raise ConfigError(f"--engine: expected one of {', '.join(ENGINE_METHODS)}, got {engine_name!r}")
    if spec.method in supported:
        return
    names = ", ".join(METHOD_TO_DECODING_TYPE[m] for m in supported if m != "none")
    others = [e for e, methods in ENGINE_METHODS.items() if spec.method in methods]
    hint = f"; use --engine {others[0]}" if others else ""
    raise ConfigError(
        f"{spec.source or '--spec'}: decoding_type {METHOD_TO_DECODING_TYPE[spec.method]} is not supported by the {engine_name} engine (supported: {names}){hint}"
    )


def default_candidates_path(engine_name: str) -> str:
    """The shipped default arms for an engine: trt_configs/candidates/<engine>_default.yaml."""
    return str(CANDIDATES_DIR / f"{engine_name}_default.yaml")


def resolve_spec_arg(
    spec: str, candidates_path: str | None, engine_name: str, draft_model: str | None
) -> SpecChoice:
    """Turn `--spec auto|none|FILE` (plus `--candidates` and `--draft-model`) into a SpecChoice,
    validated for `engine_name`. See the module docstring for the rules."""
    if engine_name not in ENGINE_METHODS:
        raise ConfigError(f"--engine: expected one of {', '.join(ENGINE_METHODS)}, got {engine_name!r}")
    if spec == "none":
        return SpecChoice(arms=(), calibrate=False, source="none")
    if spec == "auto":
        source = candidates_path or default_candidates_path(engine_name)
        return _calibrated_choice(source, engine_name, draft_model)
    data = read_yaml(spec)
    if is_candidates_file(data):
        return _calibrated_choice(spec, engine_name, draft_model)
    loaded = load_spec_file(spec, draft_model=draft_model)
    check_engine_supports(loaded.spec, engine_name)
    arms = () if loaded.spec.method == "none" else (loaded.spec,)
    return SpecChoice(arms=arms, calibrate=False, source=spec)


def _calibrated_choice(source: str, engine_name: str, draft_model: str | None) -> SpecChoice:
    arms, dropped = [], []
    for arm in load_candidates(source):
        check_engine_supports(arm, engine_name)
        if arm.method == "draft_target":
            if draft_model is not None:
                arm = dataclasses.replace(arm, draft_model=draft_model)
            elif arm.draft_model is None:
                dropped.append(f"{arm.label}: no draft model configured ({arm.source} has no speculative_model_dir and no --draft-model was given)")
                continue
        if arm not in arms:
            arms.append(arm)
    return SpecChoice(arms=tuple(arms), calibrate=True, source=source, dropped=tuple(dropped))


def validate_file(path: str | os.PathLike) -> str:
    """Validate an option file or a candidates file (for `batchspec validate`); return a one-line
    summary, or raise ConfigError naming the file, key and expectation."""
    path = str(path)
    data = read_yaml(path)
    if is_candidates_file(data):
        arms = load_candidates(path)
        missing = [a.label for a in arms if a.method == "draft_target" and a.draft_model is None]
        note = f" ({', '.join(missing)} need --draft-model)" if missing else ""
        return f"{path}: candidates file, {len(arms)} arms + none: {', '.join(a.label for a in arms)}{note}"
    loaded = _parse_options_file(path, data, require_draft=True)
    spec = loaded.spec
    if spec.method == "none":
        return f"{path}: TensorRT-LLM option file, no speculation"
    draft = f", draft {spec.draft_model}" if spec.draft_model else ""
    return f"{path}: TensorRT-LLM option file, {METHOD_TO_DECODING_TYPE[spec.method]} max_draft_len={spec.draft_len}{draft}"
