"""Candidates files and `--spec`: which arms a run calibrates over, or the one arm it runs; the
rules are docs/spec-settings.md's ("Candidates files", "`--spec auto | none | FILE`")."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Annotated, Any, Union

from pydantic import AfterValidator, BeforeValidator, Field

from batchspec.config.kit import Expect, Section, check, describe, integer, read_yaml, relative_to, said, text
from batchspec.config.spec import _parse_options_file, is_candidates_file, load_spec_file, with_draft_model
from batchspec.data import CANDIDATES_DIR
from batchspec.engine.base import ENGINE_METHODS, SpecConfig
from batchspec.engine.trtllm.translate import METHOD_TO_DECODING_TYPE, SPEC_PREFIX, TRTLLM_REFUSED_METHODS
from batchspec.errors import ConfigError

Length = integer(ge=1)
Lengths = Annotated[list[Length], Field(min_length=1), AfterValidator(lambda v: list(dict.fromkeys(v))),
                    BeforeValidator(lambda v: v if isinstance(v, list) else [v],
                                    json_schema_input_type=Union[Length, Annotated[list[Length], Field(min_length=1)]]),
                    Expect("an integer >= 1 or a non-empty list of them")]


class Candidate(Section):
    """One entry: an option file, and optionally the draft lengths to try and a replacement draft."""

    missing = "nothing"

    config: text("the path of a TensorRT-LLM option file") = Field(description="A TensorRT-LLM option file with a speculative_config, relative to this file.")
    max_draft_len: Lengths = Field(None, description="Draft lengths to try, one arm each; default: the file's own.")
    speculative_model_dir: text("a non-empty string (a model location)") = Field(None, description="Replaces the file's draft model (Draft_Target, Eagle3).")
    speculative_model: text("a non-empty string (a model location)") = Field(None, description="The same as speculative_model_dir.")

    @classmethod
    def unknown(cls, key: Any) -> Any:
        return said(f"unknown key (valid: {', '.join(cls.keys())})", key)


class CandidatesFile(Section):
    """A batchspec candidates file: the arms `--spec auto` calibrates over ("none" is always added)."""

    candidates: Annotated[list[Candidate], Field(min_length=1), Expect("a non-empty list of {config: FILE, max_draft_len: [...]}")] = Field(
        description="The arms, in order: each entry's option file at each of its draft lengths.")

    @classmethod
    def unknown(cls, key: Any) -> Any:
        return said("unknown key (a candidates file holds only 'candidates')", key)


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


def load_candidates(path: str | os.PathLike) -> list[SpecConfig]:
    """The calibration arms of a candidates file, in file order, without "none" and without
    duplicates. Draft_Target arms may come back with `draft_model` None (see `resolve_spec_arg`)."""
    path = str(path)
    data = read_yaml(path)
    if not is_candidates_file(data):
        raise ConfigError(f"{path}: candidates: expected a candidates file with a top-level 'candidates' list")
    arms: list[SpecConfig] = []
    for i, entry in enumerate(check(CandidatesFile, data, path, show=describe).candidates):
        for arm in _entry_arms(path, f"candidates[{i}]", entry):
            if arm not in arms:
                arms.append(arm)
    return arms


def _entry_arms(path: str, where: str, entry: Candidate) -> list[SpecConfig]:
    config = relative_to(path, entry.config)
    base = _parse_options_file(config, read_yaml(config), require_draft=False).spec
    if base.method == "none":
        raise ConfigError(f"{path}: {where}.config: {config} has no speculative_config; calibration adds 'none' itself, remove this entry")
    draft = entry.speculative_model or entry.speculative_model_dir
    if draft is not None:
        if base.method not in ("draft_target", "eagle3"):
            raise ConfigError(f"{path}: {where}.speculative_model_dir: {base.method} takes no draft model")
        base = dataclasses.replace(base, draft_model=draft)
    if entry.max_draft_len is None:
        return [base]
    lengths = entry.max_draft_len
    if any(k == SPEC_PREFIX + "draft_len_schedule" for k, _ in base.options) and lengths != [base.draft_len]:
        raise ConfigError(f"{path}: {where}.max_draft_len: {config} sets draft_len_schedule, which pins max_draft_len {base.draft_len}; list only that length or drop the schedule")
    return [base.with_draft_len(k) for k in lengths]


# ---------------------------------------------------------------------------------------------
# --spec and engines


def check_engine_supports(spec: SpecConfig, engine_name: str) -> None:
    """Raise ConfigError when `engine_name` cannot run `spec`'s method."""
    supported = ENGINE_METHODS[engine_name]  # a known engine: resolve_spec_arg checked it
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
                arm = with_draft_model(arm, draft_model)
            elif arm.draft_model is None:
                dropped.append(f"{arm.label}: no draft model configured ({arm.source} has no speculative_model_dir and no --draft-model was given)")
                continue
        if arm not in arms:
            arms.append(arm)
    return SpecChoice(arms=tuple(arms), calibrate=True, source=source, dropped=tuple(dropped))
