"""The one YAML reader and the small checkers every config file kind is validated with.

Every file batchspec reads (pipelines, TensorRT-LLM option files, candidates files, job files) goes
through `read_yaml`, over fsspec, so any of them may live at a URL (`s3://bucket/pipeline.yaml`).
Every check raises `ConfigError` with one line: "FILE: KEY: expected ..., got ...".
"""

from __future__ import annotations

from typing import Any

import fsspec
import yaml

from batchspec.errors import ConfigError


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


def describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})" if isinstance(value, str) else repr(value)


def need_int(path: str, key: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{path}: {key}: expected an integer >= {minimum}, got {describe(value)}")
    return value


def need_bool(path: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{path}: {key}: expected true or false, got {describe(value)}")
    return value


def need_fraction(path: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ConfigError(f"{path}: {key}: expected a number in (0, 1], got {describe(value)}")
    return float(value)


def need_text(path: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{path}: {key}: expected a non-empty string (a model location), got {describe(value)}")
    return value


def need_mapping(path: str, key: str, value: Any) -> dict:
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: {key}: expected a mapping, got {describe(value)}")
    return value
