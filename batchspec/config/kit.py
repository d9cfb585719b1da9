"""The one YAML reader and the small checkers every config file kind is validated with.

Every file batchspec reads (pipelines, TensorRT-LLM option files, candidates files, job files) goes
through `read_yaml`, over fsspec, so any of them may live at a URL (`s3://bucket/pipeline.yaml`).
Every check raises `ConfigError` with one line: "FILE: KEY: expected ..., got ...".
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import typing
from typing import Any, Callable, Mapping

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
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f":{mark.line + 1}" if mark is not None else ""
        context = exc.context_mark and exc.problem_mark and exc.context_mark.line != exc.problem_mark.line
        since = f" ({exc.context} that starts at line {exc.context_mark.line + 1})" if context else ""
        raise ConfigError(f"{path}{where}: invalid YAML: {exc.problem or exc.context}{since}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {' '.join(str(exc).split())}") from None
    if _expands_past(data, MAX_VALUES):
        raise ConfigError(f"{path}: YAML aliases expand it past {MAX_VALUES} values (an alias bomb?)")
    return data


MAX_VALUES = 100_000  # values a config document may hold once its aliases are expanded


def _expands_past(data: Any, limit: int) -> bool:
    """Whether `data`, its aliases expanded (a shared or cyclic node counts each time it is
    reached), holds more than `limit` values: a walk that stops at the limit, so an alias bomb or
    a cycle costs `limit` steps, never its expansion."""
    stack, seen = [data], 0
    while stack:
        value = stack.pop()
        seen += 1
        if seen > limit:
            return True
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False


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


# ---------------------------------------------------------------------------------------------
# Typed fields: a dataclass field's type hint and its declared range are the whole rule.
#
# A field declares its range in `metadata` (plain data, so the declaring module needs nothing
# from here):  min / max (inclusive), above (exclusive lower bound), choices (a tuple),
# expected (the noun for a string, e.g. "a model name, folder or URL"), or, for the odd field,
# convert (value -> value, raising ValueError) together with expected (the whole description).
# int, float, bool and str fields, and `X | None`, need nothing more.

Rule = tuple[str, Callable[[Any], Any]]
_NOUN = {bool: "true or false", int: "an integer", float: "a number", str: "a non-empty string"}


def field_rules(cls: type, skip: tuple[str, ...] = ()) -> dict[str, Rule]:
    """name -> (what is expected, converter) for every field of the dataclass `cls`."""
    hints = typing.get_type_hints(cls)
    return {f.name: _rule(f, hints[f.name]) for f in dataclasses.fields(cls) if f.name not in skip}


def check_value(where: str, key: str, value: Any, rule: Rule) -> Any:
    """The converted value, or ConfigError "WHERE: KEY: expected ..., got VALUE"."""
    expected, convert = rule
    try:
        return convert(value)
    except (ValueError, TypeError):
        raise ConfigError(f"{where}: {key}: expected {expected}, got {value!r}") from None


def check_fields(where: str, key: str, cls: type, value: Any) -> dict[str, Any]:
    """A mapping of `cls` fields, each checked and converted (`key` prefixes the error keys)."""
    rules = field_rules(cls)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: {key}: expected a mapping of {', '.join(rules)}, got {value!r}")
    out = {}
    for name, v in value.items():
        if name not in rules:
            raise ConfigError(f"{where}: {key}.{name}: unknown key; expected one of {', '.join(rules)}")
        out[name] = check_value(where, f"{key}.{name}", v, rules[name])
    return out


def _rule(f: dataclasses.Field, hint: Any) -> Rule:
    meta = f.metadata
    if "convert" in meta:
        return meta["expected"], meta["convert"]
    args = typing.get_args(hint)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), hint) if args else hint
    assert base in _NOUN, f"{f.name}: declare `convert` and `expected` for a field of type {hint}"
    choices = meta.get("choices")
    if choices is not None:
        expected = f"one of {', '.join(map(str, choices))}"
    else:
        expected = meta.get("expected") or _NOUN[base]
        expected += _range_text(meta)
    if optional:
        expected += " or null"

    def convert(v: Any) -> Any:
        if v is None and optional:
            return None
        if choices is not None:
            if v not in choices:
                raise ValueError
            return v
        if base is bool:
            if not isinstance(v, bool):
                raise ValueError
            return v
        if base is str:
            if not isinstance(v, str) or not v.strip():
                raise ValueError
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (base is int and not isinstance(v, int)):
            raise ValueError
        if not _in_range(v, meta):
            raise ValueError
        return float(v) if base is float else v

    return expected, convert


def _in_range(v: float, meta: Mapping[str, Any]) -> bool:
    if v != v:  # NaN
        return False
    if "min" in meta and v < meta["min"]:
        return False
    if "above" in meta and v <= meta["above"]:
        return False
    return not ("max" in meta and v > meta["max"])


def _range_text(meta: Mapping[str, Any]) -> str:
    low = ("[", meta["min"]) if "min" in meta else ("(", meta["above"]) if "above" in meta else None
    if low is not None and "max" in meta:
        return f" in {low[0]}{low[1]}, {meta['max']}]"
    if low is not None:
        return f" {'>=' if low[0] == '[' else '>'} {low[1]}"
    if "max" in meta:
        return f" <= {meta['max']}"
    return ""


def relative_to(base: str, target: str) -> str:
    """`target` as written in the file at `base` (a path or URL): a relative path is taken from
    that file's folder, on the same filesystem; absolute paths and URLs are left as they are."""
    protocol, _ = fsspec.core.split_protocol(target)
    if protocol or posixpath.isabs(target) or os.path.isabs(target):
        return target
    base_protocol, base_path = fsspec.core.split_protocol(base)
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(base_path), target))
    return f"{base_protocol}://{joined}" if base_protocol else joined


def exists(path: str) -> bool:
    """Whether a file or folder exists at a path or URL (False when it cannot be asked)."""
    try:
        fs, inner = fsspec.core.url_to_fs(path)
        return fs.exists(inner)
    except (OSError, ValueError, ImportError):
        return False
