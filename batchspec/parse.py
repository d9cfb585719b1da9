"""Turning input rows into engine requests (inside a worker): one `Request` per row, or a one-line
per-row error when the row cannot run.

What this module owns: the input columns the pipeline consumes (a `prompt` string or a `messages`
list of {role, content}, the optional per-row sampling columns `max_tokens`, `temperature`, `top_p`,
`seed`, `stop`, and `response_format`: structured output in the OpenAI batch shape, a struct or a
JSON string, batchspec.engine.response_format) and what a row's values must be. Every other column
passes through to the output untouched (batchspec.read.passthrough_schema). It knows nothing about
files or shards: it gets an Arrow table and the rows' ids.

A row without a `seed` samples with one derived from the run seed and its id, so the same row
samples the same text whatever shard or batch it lands in.

Prompt format: under "chat" (the default) a text `prompt` becomes one user message, so the engine
renders it through the model's chat template, as a chat endpoint of the batch APIs (or Ray Data
LLM's chat-template stage) would; under "raw" it stays text, tokenized as is (base models).
`messages` always go through the template.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass

import pyarrow as pa

from batchspec.engine.base import Request, SamplingParams
from batchspec.engine.response_format import ResponseFormat, parse_response_format

PROMPT_COLUMNS = ("prompt", "messages")
SAMPLING_COLUMNS = ("max_tokens", "temperature", "top_p", "seed", "stop", "response_format")
CONSUMED_COLUMNS = (*PROMPT_COLUMNS, "id", *SAMPLING_COLUMNS)


@dataclass(frozen=True)
class RowDefaults:
    """How rows run unless they say otherwise (from options / pipeline file): the sampling values
    for rows that do not carry their own, how a text prompt is presented (engine.base.PROMPT_FORMATS),
    and the response_format of rows whose column is null."""

    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    prompt_format: str = "chat"
    response_format: ResponseFormat | None = None  # rows whose response_format is null get it


@dataclass(frozen=True)
class ParsedRow:
    """One input row: the request to run, or `error` (one line) when the row cannot run."""

    request: Request
    error: str | None = None



def parse_rows(table: pa.Table, ids: list[str], defaults: RowDefaults) -> list[ParsedRow]:
    """One ParsedRow per table row, in order; a row that cannot run gets a one-line error."""
    cols = {name: table.column(name).to_pylist() for name in table.column_names if name in CONSUMED_COLUMNS}
    return [_parse_row({c: v[i] for c, v in cols.items()}, ids[i], defaults) for i in range(table.num_rows)]


def _parse_row(row: dict, row_id: str, defaults: RowDefaults) -> ParsedRow:
    try:
        params = _sampling(row, row_id, defaults)
        prompt, messages = _prompt(row)
        raw = row.get("response_format")
        response_format = defaults.response_format if raw is None else parse_response_format(raw)
    except ValueError as exc:
        return ParsedRow(Request(row_id), str(exc))
    if prompt is not None and defaults.prompt_format == "chat":
        prompt, messages = None, ({"role": "user", "content": prompt},)
    return ParsedRow(Request(row_id, prompt=prompt, messages=messages, params=params, response_format=response_format))


def _prompt(row: dict) -> tuple[str | None, tuple[dict[str, str], ...] | None]:
    prompt, messages = row.get("prompt"), row.get("messages")
    if prompt is not None:
        if not isinstance(prompt, str):
            raise ValueError(f"prompt must be a string, got {type(prompt).__name__}")
        if not prompt.strip():
            raise ValueError("prompt is empty")
        return prompt, None
    if messages is None:
        raise ValueError("prompt and messages are both null")
    if isinstance(messages, str):  # a JSON-encoded list is common in exported data
        try:
            messages = json.loads(messages)
        except json.JSONDecodeError:
            raise ValueError("messages is a string that is not a JSON list") from None
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {role, content}")
    out = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError("messages must be a list of {role: string, content: string}")
        out.append({"role": m["role"], "content": m["content"]})
    return None, tuple(out)


def _sampling(row: dict, row_id: str, d: RowDefaults) -> SamplingParams:
    max_tokens = _value(row, "max_tokens", d.max_tokens, int)
    temperature = _value(row, "temperature", d.temperature, float)
    top_p = _value(row, "top_p", d.top_p, float)
    seed = _value(row, "seed", None, int)
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if not temperature >= 0 or math.isinf(temperature):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if seed is None and d.seed is not None:
        # A per-row seed from the run seed and the id: the same row samples the same text whatever
        # shard or batch it lands in.
        seed = (d.seed * 1_000_003 + zlib.crc32(row_id.encode())) % (2**31)
    return SamplingParams(max_tokens, temperature, top_p, seed, _stop(row.get("stop")))


def _value(row: dict, name: str, default, kind: type):
    value = row.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        raise ValueError(f"{name} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    return kind(value)


def _stop(value) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(s for s in value if s)
    raise ValueError("stop must be a string or a list of strings")

