"""A row's `response_format`: the output's JSON schema, in the OpenAI batch shape, engine-neutral.

    {"type": "json_schema", "json_schema": {"name": "...", "schema": {...}, "strict": true}}
    {"type": "json_object"}          any JSON object
    {"type": "text"}                 no constraint (a row opting out of a run's default)

The value may come as a mapping (a Parquet struct, a YAML or JSON file) or as a JSON string. A
struct column gives every row every key its type has, the missing ones as nulls, so keys whose
value is null are dropped from a schema read as a struct (a JSON string keeps them). What this
module checks is the shape; whether a grammar library can compile the schema is the engine's
question (its error is the row's, as this module's are).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

KINDS = ("json_schema", "json_object", "text")
ANY_OBJECT = '{"type":"object"}'


@dataclass(frozen=True)
class ResponseFormat:
    """A constraint on a row's output: `schema` is the JSON schema as canonical JSON text (keys
    no spaces, keys in the order given: the order the output writes them), the key compiled grammars are cached by; `name` is the OpenAI name."""

    schema: str
    name: str | None = None

    @property
    def schema_dict(self) -> dict:
        return json.loads(self.schema)


def parse_response_format(value: Any) -> ResponseFormat | None:
    """The constraint a `response_format` value asks for (None: unconstrained). Raises ValueError
    with one line naming what is wrong, starting "response_format"."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"response_format is a string that is not JSON ({exc.msg} at char {exc.pos})") from None
    elif isinstance(value, dict):
        value = _without_nulls(value)
    if not isinstance(value, dict):
        raise ValueError(f"response_format must be an object with a 'type', got {type(value).__name__}")
    kind = value.get("type")
    if kind not in KINDS:
        raise ValueError(f"response_format.type must be one of {', '.join(KINDS)}, got {kind!r}")
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat(ANY_OBJECT)
    spec = value.get("json_schema")
    if isinstance(spec, str):  # a struct column whose nested schema was stored as JSON text
        spec = parse_json(spec, "response_format.json_schema")
    if not isinstance(spec, dict):
        raise ValueError(f"response_format.json_schema must be an object with a 'schema', got {type(spec).__name__}")
    schema = spec.get("schema")
    if isinstance(schema, str):
        schema = parse_json(schema, "response_format.json_schema.schema")
    if not isinstance(schema, dict):
        raise ValueError(f"response_format.json_schema.schema must be a JSON object, got {type(schema).__name__}")
    name = spec.get("name")
    if name is not None and not isinstance(name, str):
        raise ValueError(f"response_format.json_schema.name must be a string, got {type(name).__name__}")
    return ResponseFormat(json.dumps(schema, separators=(",", ":")), name)


def parse_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} is a string that is not JSON ({exc.msg} at char {exc.pos})") from None


def _without_nulls(value: Any) -> Any:
    """Mapping keys whose value is null dropped, at every depth (list items are kept as they are,
    their mappings cleaned): what an Arrow struct adds for keys a row did not have."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value
