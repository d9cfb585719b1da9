"""Candidates files and `--spec`: which arms a run calibrates over, or the one arm it runs.

A batchspec candidates file lists the calibration arms. The option files must stay valid for
trtllm-serve, which takes one `max_draft_len`, so the list of draft lengths to try lives here::

    candidates:
      - config: ../ngram.yaml           # path relative to this file
        max_draft_len: [2, 4, 6, 8]     # optional: one arm per value (default: the file's)
      - config: ../draft_target.yaml
        max_draft_len: [2, 4, 6]
        speculative_model_dir: qwen2.5-coder-0.5b   # optional: replaces the file's draft

"none" is never listed: calibration always adds it itself. A candidate file that mixes a list of
draft lengths with a `draft_len_schedule` is rejected (the schedule pins max_draft_len).

`resolve_spec_arg` turns `--spec auto|none|FILE` into a `SpecChoice`: `none` never speculates;
`auto` calibrates over the engine's default candidates file (or `--candidates`); a FILE that is an
option file runs exactly that arm with no calibration; a FILE that is a candidates file calibrates
over its arms. `--draft-model` overrides the draft of every Draft_Target arm. Under `auto` (and a
candidates FILE) a Draft_Target arm with no draft model anywhere is dropped and the reason recorded
in `SpecChoice.dropped`; an explicit option FILE without its draft is an error instead. An arm the
chosen engine cannot run is an error naming the file and the engine to use instead.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from batchspec.config.kit import describe, need_int, need_mapping, need_text, read_yaml
from batchspec.config.kit import relative_to as _relative
from batchspec.config.spec import (
    _parse_options_file,
    is_candidates_file,
    load_spec_file,
)
from batchspec.data import CANDIDATES_DIR
from batchspec.engine.base import ENGINE_METHODS, SpecConfig
from batchspec.engine.trtllm.translate import METHOD_TO_DECODING_TYPE, SPEC_PREFIX, TRTLLM_REFUSED_METHODS
from batchspec.errors import ConfigError

CANDIDATE_KEYS = ("config", "max_draft_len", "speculative_model_dir", "speculative_model")


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


def _entry_lengths(path: str, key: str, value: Any) -> list[int]:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise ConfigError(f"{path}: {key}: expected an integer >= 1 or a non-empty list of them, got []")
    lengths = [need_int(path, key, v, 1) for v in values]
    return sorted(set(lengths), key=lengths.index)


def load_candidates(path: str | os.PathLike) -> list[SpecConfig]:
    """The calibration arms of a candidates file, in file order, without "none" and without
    duplicates. Draft_Target arms may come back with `draft_model` None (see `resolve_spec_arg`)."""
    path = str(path)
    data = read_yaml(path)
    if not is_candidates_file(data):
        raise ConfigError(f"{path}: candidates: expected a candidates file with a top-level 'candidates' list")
    extra = sorted(set(data) - {"candidates"})
    if extra:
        raise ConfigError(f"{path}: {extra[0]}: unknown key (a candidates file holds only 'candidates')")
    entries = data["candidates"]
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{path}: candidates: expected a non-empty list of {{config: FILE, max_draft_len: [...]}}, got {describe(entries)}")
    arms: list[SpecConfig] = []
    for i, entry in enumerate(entries):
        for arm in _entry_arms(path, f"candidates[{i}]", entry):
            if arm not in arms:
                arms.append(arm)
    return arms


def _entry_arms(path: str, where: str, entry: Any) -> list[SpecConfig]:
    entry = need_mapping(path, where, entry)
    for key in entry:
        if key not in CANDIDATE_KEYS:
            raise ConfigError(f"{path}: {where}.{key}: unknown key (valid: {', '.join(CANDIDATE_KEYS)})")
    if "config" not in entry:
        raise ConfigError(f"{path}: {where}.config: expected the path of a TensorRT-LLM option file, got nothing")
    config = _relative(path, need_text(path, f"{where}.config", entry["config"]))
    data = read_yaml(config)
    base = _parse_options_file(config, data, require_draft=False).spec
    if base.method == "none":
        raise ConfigError(f"{path}: {where}.config: {config} has no speculative_config; calibration adds 'none' itself, remove this entry")
    draft = None
    for key in ("speculative_model_dir", "speculative_model"):
        if key in entry:
            draft = need_text(path, f"{where}.{key}", entry[key])
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
    if engine_name == "trtllm" and spec.method in TRTLLM_REFUSED_METHODS:
        raise ConfigError(f"{spec.source or '--spec'}: decoding_type {METHOD_TO_DECODING_TYPE[spec.method]}: "
                          f"{TRTLLM_REFUSED_METHODS[spec.method]}; use --engine torch")
    names = ", ".join(METHOD_TO_DECODING_TYPE[m] for m in supported if m != "none")
    others = [e for e, methods in ENGINE_METHODS.items() if spec.method in methods]
    hint = f"; use --engine {others[0]}" if others else ""
    raise ConfigError(
        f"{spec.source or '--spec'}: decoding_type {METHOD_TO_DECODING_TYPE[spec.method]} is not supported by the {engine_name} engine (supported: {names}){hint}"
    )


def default_candidates_path(engine_name: str) -> str:
    """The shipped default arms for an engine: package data trt_configs/candidates/<engine>_default.yaml."""
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
