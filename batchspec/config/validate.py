"""`batchspec validate`: recognise a YAML file by its content (a batchspec job, Kubernetes
manifests, a candidates file, a pipeline, else a TensorRT-LLM option file) and check it with its own
validator; `json_schema` writes a kind's JSON Schema (docs/spec-settings.md, "Validation at the edge").
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter

from batchspec.config.candidates import CandidatesFile, load_candidates
from batchspec.config.job import JobFile, is_job_doc, load_job
from batchspec.config.kit import read_yaml
from batchspec.config.kube import check_manifests
from batchspec.config.run import FIELDS, SECTIONS, RunConfig, validate_pipeline_file
from batchspec.config.spec import OptionsFile, _parse_options_file, is_candidates_file
from batchspec.engine.trtllm.translate import METHOD_TO_DECODING_TYPE
from batchspec.errors import BatchspecError, ConfigError

# Keys only a pipeline file has: its fields less those a TensorRT-LLM option file may also carry.
PIPELINE_ONLY = tuple(key for key in (*FIELDS, *SECTIONS) if key not in ("model", "dtype"))


SCHEMAS = {"pipeline": RunConfig, "job": JobFile, "options": OptionsFile, "candidates": CandidatesFile}


def json_schema(kind: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a file kind: every key with its type, range and description."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **_unset(TypeAdapter(SCHEMAS[kind]).json_schema())}


def _unset(node: Any) -> Any:
    """Without `default: null` where null is no value the key takes (there it means "not set")."""
    if isinstance(node, list):
        return [_unset(v) for v in node]
    if not isinstance(node, dict):
        return node
    takes_null = node.get("type") == "null" or any(o.get("type") == "null" for o in node.get("anyOf", ()))
    return {k: _unset(v) for k, v in node.items() if not (k == "default" and v is None and not takes_null)}


@dataclass(frozen=True)
class Checked:
    path: str
    ok: bool
    line: str  # "OK <summary>" or the one-line error


def validate_files(paths: list[str]) -> list[Checked]:
    out = []
    for path in paths:
        try:
            out.append(Checked(path, True, "OK " + _with_path(path, validate_one(path))))
        except BatchspecError as exc:
            out.append(Checked(path, False, _with_path(path, " ".join(str(exc).split()))))
    return out


def validate_one(path: str) -> str:
    """Validate one file; return its one-line summary or raise ConfigError."""
    docs = _read_docs(path)
    if len(docs) == 1 and is_job_doc(docs[0]):
        return load_job(path).summary()
    if docs and all(isinstance(d, dict) and "apiVersion" in d for d in docs):
        return check_manifests(path, docs)
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise ConfigError(f"{path}: expected one YAML mapping (a pipeline, trt_configs, candidates or batchspec job file) "
                          f"or Kubernetes manifests with apiVersion and kind")
    data = docs[0]
    if isinstance(data.get("candidates"), list) or "speculative_config" in data:
        return validate_spec_file(path)
    if any(key in data for key in PIPELINE_ONLY):
        return validate_pipeline_file(path)
    return validate_spec_file(path)


def validate_spec_file(path: str | os.PathLike) -> str:
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


def _read_docs(path: str) -> list[Any]:
    docs = [d for d in read_yaml(path, documents=True) if d is not None]
    if not docs:
        raise ConfigError(f"{path}: empty file; expected a pipeline, trt_configs, candidates or batchspec job file, or Kubernetes manifests")
    return docs


def _with_path(path: str, line: str) -> str:
    return line if line.startswith(path) else f"{path}: {line}"
