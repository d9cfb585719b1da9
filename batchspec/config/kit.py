"""The one YAML reader, the field types every config model is built from, and the one line a bad
value becomes: "FILE: KEY: expected ..., got VALUE" (docs/spec-settings.md, "Validation at the edge").
"""

from __future__ import annotations

import dataclasses
import functools
import os
import posixpath
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Callable, ClassVar, Literal, Optional

import fsspec
import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, conint, constr, create_model, model_validator
from pydantic import StrictBool, confloat
from pydantic_core import PydanticCustomError, core_schema

from batchspec.errors import ConfigError


def read_yaml(path: str, *, documents: bool = False) -> Any:
    """Parse one YAML file (with `documents`, the list of its documents) through fsspec; bad YAML
    is one line with the file and the line."""
    try:
        with fsspec.open(path, "r", encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    try:
        data = list(yaml.safe_load_all(text)) if documents else yaml.safe_load(text)
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


# ---------------------------------------------------------------------------------------------
# Errors of our own: "expected WORDS" (the line adds ", got VALUE") and a sentence said as is.
# A `key` extends the error's location by one key (an unknown key, a rule of the whole mapping).

def expected(words: str, key: str | None = None) -> PydanticCustomError:
    return PydanticCustomError("expected", "expected {words}", {"words": words, **({"key": key} if key else {})})


def said(message: str, key: str | None = None) -> PydanticCustomError:
    return PydanticCustomError("said", "{message}", {"message": message, **({"key": key} if key else {})})


@dataclass(frozen=True)
class Expect:
    """A field's expectation in words: a failure of its own check becomes "expected WORDS"; one
    that already says its own (an item of a list, a key of a nested section) passes through."""

    words: str

    def __get_pydantic_core_schema__(self, source: Any, handler: Callable) -> core_schema.CoreSchema:
        return core_schema.no_info_wrap_validator_function(self._check, handler(source))

    def _check(self, value: Any, handler: Callable) -> Any:
        try:
            return handler(value)
        except ValidationError as exc:
            if all(e["type"] in ("expected", "said") for e in exc.errors()):
                raise
            raise expected(self.words) from None


def _typed(tp: Any, words: str, null: bool) -> Any:
    return Annotated[Optional[tp] if null else tp, Expect(words + (" or null" if null else ""))]


def integer(ge: int | None = None, le: int | None = None, *, null: bool = False) -> Any:
    return _typed(conint(strict=True, ge=ge, le=le), f"an integer{_range(ge, None, le)}", null)


def number(ge: float | None = None, gt: float | None = None, le: float | None = None, *, null: bool = False) -> Any:
    return _typed(confloat(strict=True, ge=ge, gt=gt, le=le), f"a number{_range(ge, gt, le)}", null)


def flag(*, null: bool = False) -> Any:
    return _typed(StrictBool, "true or false", null)


def text(words: str = "a non-empty string", *, null: bool = False) -> Any:
    return _typed(constr(strict=True, pattern=r"\S"), words, null)


def one_of(*choices: Any, null: bool = False) -> Any:
    return _typed(Literal[choices], f"one of {', '.join(map(str, choices))}", null)


def nullable(tp: Any) -> Any:
    """`tp` (one of the types above) that also takes null, words unchanged: a key whose null means unset."""
    inner, *meta = typing.get_args(tp)
    return Annotated[(Optional[inner], *meta)]


def _range(ge: float | None, gt: float | None, le: float | None) -> str:
    low = ("[", ge) if ge is not None else ("(", gt) if gt is not None else None
    if low is not None and le is not None:
        return f" in {low[0]}{low[1]}, {le}]"
    if low is not None:
        return f" {'>=' if low[0] == '[' else '>'} {low[1]}"
    return f" <= {le}" if le is not None else ""


def known_keys(data: Any, keys: tuple[str, ...] | None, what: str, unknown: Callable, fields: dict | None = None, missing: str = "") -> Any:
    """`data` as a mapping (`what`) of `keys` only (None: any; `unknown(key)` the error of any
    other), every required one of `fields` present (`missing`: what a line says of an absent one)."""
    if not isinstance(data, dict):
        raise expected(what)
    for key in data:
        if keys is not None and key not in keys:
            raise unknown(key)
    for name, info in (fields or {}).items():
        if info.is_required() and name not in data:
            words = next((m.words for m in info.metadata if isinstance(m, Expect)), "a value")
            raise said(f"expected {words}, got {missing}", name)
    return data


class Section(BaseModel):
    """A mapping of described keys: anything else is refused by name before any value is checked."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    what: ClassVar[str | None] = "a mapping"  # None: "a mapping of KEY, KEY, ..."
    missing: ClassVar[str] = "nothing (the key is required)"

    @model_validator(mode="before")
    @classmethod
    def _known(cls, data: Any) -> Any:
        what = cls.what or f"a mapping of {', '.join(cls.keys())}"
        return data if isinstance(data, cls) else known_keys(data, cls.keys(), what, cls.unknown, cls.model_fields, cls.missing)

    @classmethod
    def keys(cls) -> tuple[str, ...] | None:
        return None if cls.model_config.get("extra") == "allow" else tuple(cls.model_fields)

    @classmethod
    def unknown(cls, key: Any) -> PydanticCustomError:
        return said(f"unknown key; expected one of {', '.join(cls.keys())}", key)

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Callable) -> dict:
        out = handler.resolve_ref_schema(handler(schema))
        if cls.model_config.get("extra") == "allow" and cls.keys() is not None:  # other keys, by name only
            out["propertyNames"] = {"enum": list(cls.keys())}
        return out


def check(model: Any, data: Any, where: str, *, key: str = "", show: Callable[[Any], str] = repr, context: dict | None = None) -> Any:
    """`data` validated by `model` (a class or a type), or ConfigError: its first error as the line
    "WHERE: KEY: expected ..., got VALUE" (`key` prefixes the location; `show` writes the value)."""
    try:
        return TypeAdapter(model).validate_python(data, context=context)
    except ValidationError as exc:
        err = exc.errors()[0]
        ctx = err.get("ctx") or {}
        path = _key_path((*err["loc"], *([ctx["key"]] if "key" in ctx else [])), data)
        path = f"{key}.{path}" if key and path and not path.startswith("[") else key + path
        if err["type"] == "said":
            message = ctx["message"]
        elif err["type"] == "expected":
            message = f"expected {ctx['words']}, got {show(err['input'])}"
        else:  # pydantic's own words, for a type that says none of its own
            message = f"{err['msg']}, got {show(err['input'])}"
        raise ConfigError(f"{where}: {path}: {message}" if path else f"{where}: {message}") from None


def _key_path(loc: tuple, data: Any) -> str:
    """The location as the YAML's key path: a union's tag or a validator's name is no key."""
    out, node = "", data
    for i, part in enumerate(loc):
        if isinstance(part, int) and isinstance(node, (list, tuple)):
            out += f"[{part}]"
            node = node[part] if part < len(node) else None
        elif (isinstance(node, dict) and part in node) or (i == len(loc) - 1 and not isinstance(part, int)):
            out += f"{'.' if out else ''}{part}"
            node = node.get(part) if isinstance(node, dict) else None
    return out


# ---------------------------------------------------------------------------------------------
# Dataclasses declared outside config (calibration's settings): a field's type hint and its
# `metadata` (min / max inclusive, above exclusive, choices, expected, description) are its rule.

@functools.cache
def model_of(cls: type) -> type[Section]:
    """A Section of the dataclass `cls`'s fields, each with its rule, default and description."""
    hints = typing.get_type_hints(cls)
    rules = {f.name: (_rule(hints[f.name], f.metadata), Field(f.default, description=f.metadata.get("description")))
             for f in dataclasses.fields(cls)}
    model = create_model(cls.__name__, __base__=Section, __doc__=(cls.__doc__ or "").split(". ")[0], **rules)
    model.what = None
    return model


def _rule(hint: Any, meta: typing.Mapping[str, Any]) -> Any:
    args = typing.get_args(hint)
    null = type(None) in args
    base = next((a for a in args if a is not type(None)), hint) if args else hint
    if "choices" in meta:
        return one_of(*meta["choices"], null=null)
    if base is bool:
        return flag(null=null)
    if base is str:
        return text(meta.get("expected", "a non-empty string"), null=null)
    if base is int:
        return integer(meta.get("min"), meta.get("max"), null=null)
    assert base is float, f"{hint}: a dataclass field checked by its metadata is a bool, int, float or str"
    return number(meta.get("min"), meta.get("above"), meta.get("max"), null=null)


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
