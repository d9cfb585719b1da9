"""Turning input rows into engine requests (inside a worker): one `Request` per row, or a one-line
per-row error when the row cannot run.

What this module owns: the input columns the pipeline consumes (a `prompt` string or a `messages`
list of {role, content}, the optional per-row sampling columns `max_tokens`, `temperature`, `top_p`,
`seed`, `stop`, and `response_format`: structured output in the OpenAI batch shape, a struct or a
JSON string, batchspec.engine.response_format) and what a row's values must be. Every other column
passes through to the output untouched (batchspec.read.passthrough_schema). It knows nothing about
files or shards: it gets an Arrow table and the rows' ids.

Whatever a cell holds, it fails its own row at most: a value the column cannot even convert (bytes
that are not UTF-8, a struct nested past Python's recursion limit) is found cell by cell, and any
exception while a row is parsed becomes that row's one-line error (`ParsedRow.error`).

A row without a `seed` samples with one derived from the run seed and its id, so the same row
samples the same text whatever shard or batch it lands in.

Prompt format: under "chat" (the default) a text `prompt` becomes one user message, so the engine
renders it through the model's chat template, as a chat endpoint of the batch APIs (or Ray Data
LLM's chat-template stage) would; under "raw" it stays text, tokenized as is (base models).
`messages` always go through the template.

Batch API request lines (read.py reads a `.jsonl` INPUT into the `batch_request` column, one line's
JSON text per row, or `batch_error` where the line is not a request) map to the same columns, the
body's fields by name: `messages` (the chat endpoint) or `prompt` (the completions endpoint),
`max_tokens` or `max_completion_tokens`, `temperature`, `top_p`, `seed`, `stop`,
`response_format`. The endpoint says how a prompt is presented, whatever the run's prompt format:
a completions prompt is text tokenized as is, chat messages go through the template. What batchspec
cannot honour is the row's error, never ignored: another `method` or `url`, a body field it does not
read (`n` 1 and `stream` false change nothing and pass), a `body.model` other than the run's. A
field the line leaves out takes the run's default (the pipeline file), not the hosted API's.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from batchspec.engine.base import Request, SamplingParams
from batchspec.engine.response_format import ResponseFormat, parse_response_format
from batchspec.errors import one_line

PROMPT_COLUMNS = ("prompt", "messages")
SAMPLING_COLUMNS = ("max_tokens", "temperature", "top_p", "seed", "stop", "response_format")
BATCH_REQUEST = "batch_request"  # a Batch API request line's JSON text (read.py, from a .jsonl INPUT)
BATCH_ERROR = "batch_error"  # why that line is not a request (not JSON, no custom_id), naming its file and line
BATCH_COLUMNS = (BATCH_REQUEST, BATCH_ERROR)
PARSED_COLUMNS = (*PROMPT_COLUMNS, *SAMPLING_COLUMNS, *BATCH_COLUMNS)  # what a request is made of (the id comes apart)
CONSUMED_COLUMNS = (*PROMPT_COLUMNS, "id", *SAMPLING_COLUMNS, *BATCH_COLUMNS)
CHAT_ROLES = ("system", "user", "assistant", "tool")  # what chat templates render
SEED_LIMIT = 2**64  # seeds are unsigned 64-bit integers (torch.Generator.manual_seed, TensorRT-LLM)


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
    model: str | None = None  # the run's model as configured: a Batch API line naming another fails


@dataclass(frozen=True)
class ParsedRow:
    """One input row: the request to run, or `error` (one line) when the row cannot run."""

    request: Request
    error: str | None = None



def parse_rows(table: pa.Table, ids: list[str], defaults: RowDefaults) -> list[ParsedRow]:
    """One ParsedRow per table row, in order; a row that cannot run gets a one-line error."""
    cols = {name: cells(table.column(name)) for name in table.column_names if name in PARSED_COLUMNS}
    return [_parse_row({c: v[i] for c, v in cols.items()}, ids[i], defaults) for i in range(table.num_rows)]


@dataclass(frozen=True)
class Unreadable:
    """A cell its column could not turn into a Python value: why, after the column's name."""

    why: str


def cells(column: pa.ChunkedArray | pa.Array) -> list:
    """The column's values; a cell that cannot be converted is an `Unreadable`, found cell by cell
    only when the whole column cannot be."""
    try:
        return column.to_pylist()
    except Exception:
        return [_cell(column, i) for i in range(len(column))]


def _cell(column, i: int):
    try:
        return column[i].as_py()
    except UnicodeDecodeError:
        return Unreadable("is not valid UTF-8")
    except RecursionError:
        return Unreadable("is nested too deeply")
    except Exception as exc:
        return Unreadable(f"cannot be read: {type(exc).__name__}: {one_line(exc)}")


def _parse_row(row: dict, row_id: str, defaults: RowDefaults) -> ParsedRow:
    try:
        bad = next((f"{name} {value.why}" for name, value in row.items() if isinstance(value, Unreadable)), None)
        if bad:
            raise ValueError(bad)
        as_text = False  # a Batch API completions prompt: tokenized as is, whatever the prompt format
        if any(name in row for name in BATCH_COLUMNS):
            row, as_text = _batch_request(row, defaults.model)
        params = _sampling(row, row_id, defaults)
        prompt, messages = _prompt(row)
        response_format = _response_format(row.get("response_format"), defaults)
    except ValueError as exc:
        return ParsedRow(Request(row_id), str(exc))
    except Exception as exc:  # anything else a cell can provoke fails its row alone, never the shard
        return ParsedRow(Request(row_id), one_line(f"row cannot be parsed: {type(exc).__name__}: {one_line(exc)}"))
    if prompt is not None and defaults.prompt_format == "chat" and not as_text:
        prompt, messages = None, ({"role": "user", "content": prompt},)
    return ParsedRow(Request(row_id, prompt=prompt, messages=messages, params=params, response_format=response_format))


# ---- Batch API request lines -------------------------------------------------------------------

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
LINE_FIELDS = ("custom_id", "method", "url", "body")
SHARED_BODY = ("model", "max_tokens", "temperature", "top_p", "seed", "stop", "response_format")
BODY_FIELDS = {CHAT: ("messages", *SHARED_BODY, "max_completion_tokens"), COMPLETIONS: ("prompt", *SHARED_BODY)}
NEUTRAL_BODY = {"n": 1, "stream": False}  # fields whose value here is what batchspec does anyway


def _batch_request(row: dict, model: str | None) -> tuple[dict, bool]:
    """A Batch API request line's columns (module docstring), and whether its prompt is text to
    tokenize as is (the completions endpoint). ValueError names what the line asks that batchspec
    cannot honour."""
    if row.get(BATCH_ERROR) is not None:
        raise ValueError(row[BATCH_ERROR])
    line = json.loads(row[BATCH_REQUEST])  # read.py kept only lines that are JSON objects
    _known("request field", line, LINE_FIELDS, "a line holds")
    if line.get("method") != "POST":
        raise ValueError(f"method must be POST, got {_short(line.get('method'))}")
    url, body = line.get("url"), line.get("body")
    if url not in BODY_FIELDS:
        raise ValueError(f"url must be {CHAT} or {COMPLETIONS}, got {_short(url)}")
    if not isinstance(body, dict):
        raise ValueError(f"body must be an object, got {type(body).__name__}")
    for name, value in NEUTRAL_BODY.items():
        if name in body and (type(body[name]) is not type(value) or body[name] != value):
            raise ValueError(f"body.{name} must be {json.dumps(value)} (batchspec writes one whole choice per line), got {_short(body[name])}")
    _known("body field", [k for k in body if k not in NEUTRAL_BODY], BODY_FIELDS[url], f"{url} reads")
    if body.get("model") is not None and model is not None and body["model"] != model:
        raise ValueError(f"body.model {_short(body['model'])} is not this run's model {model!r}")
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        raise ValueError("body.max_tokens and body.max_completion_tokens are both set; give one")
    out = {name: body[name] for name in (*PROMPT_COLUMNS, *SAMPLING_COLUMNS) if body.get(name) is not None}
    if body.get("max_completion_tokens") is not None:
        out["max_tokens"] = body["max_completion_tokens"]
    if "response_format" in out:  # as JSON text: a mapping would lose its null values (engine.response_format)
        out["response_format"] = json.dumps(out["response_format"])
    return out, url == COMPLETIONS


def _known(what: str, given, known: tuple[str, ...], reads: str) -> None:
    unknown = [k for k in given if k not in known]
    if unknown:
        names = ", ".join(_short(k) for k in unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise ValueError(f"unknown {what}{'s' if len(unknown) > 1 else ''} {names}: batchspec cannot honour "
                         f"{'them' if len(unknown) > 1 else 'it'} ({reads} {', '.join(known)})")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _response_format(raw, defaults: RowDefaults) -> ResponseFormat | None:
    if raw is None:
        return defaults.response_format
    try:
        return parse_response_format(raw)
    except RecursionError:
        raise ValueError("response_format is nested too deeply") from None


def _prompt(row: dict) -> tuple[str | None, tuple[dict[str, str], ...] | None]:
    prompt, messages = row.get("prompt"), row.get("messages")
    if prompt is not None and messages is not None:
        raise ValueError("prompt and messages are both set; give one")
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
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), (str, list)):
            raise ValueError("messages must be a list of {role: string, content: string or text parts}")
        if m["role"] not in CHAT_ROLES:
            raise ValueError(f"messages[{i}].role must be one of {', '.join(CHAT_ROLES)}; got {m['role']!r}"[:300])
        out.append({"role": m["role"], "content": _text_of(m["content"], i)})
    return None, tuple(out)


def _text_of(content: str | list, i: int) -> str:
    """A message's content as text: a string as is; a list of parts (the chat API's
    `[{"type": "text", "text": ...}]`) joined with newlines, as vLLM presents parts to a text-only
    model (vllm/entrypoints/chat_utils.py, `_parse_chat_message_content_parts`, "\n".join of the
    texts, at commit bd5ec6d50b83652c21a570b81c1fb5219a6ebf76). Any other part is the row's error."""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            what = f"type {kind!r}" if isinstance(kind, str) else "not a {type: text, text: string} part"
            raise ValueError(f"messages[{i}].content[{j}]: {what} (this engine reads text parts only)"[:300])
        texts.append(part["text"])
    if not texts:
        raise ValueError(f"messages[{i}].content is an empty list of parts")
    return "\n".join(texts)


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
    if np.float32(top_p) == 0:  # the engines sample in float32: a top_p of 0 keeps no token at all
        raise ValueError(f"top_p must be in (0, 1] and above 0 in float32 (at least 1.4e-45), got {top_p}")
    if seed is not None and not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {row.get('seed')!r}")
    if seed is None and d.seed is not None:
        # A per-row seed from the run seed and the id: the same row samples the same text whatever
        # shard or batch it lands in.
        seed = (d.seed * 1_000_003 + zlib.crc32(row_id.encode())) % (2**31)
    return SamplingParams(max_tokens, temperature, top_p, seed, _stop(row.get("stop")))


def _value(row: dict, name: str, default, kind: type):
    value = row.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    if kind is int and not (isinstance(value, int) or (math.isfinite(value) and value == int(value))):
        raise ValueError(f"{name} must be a finite integer, got {value!r}")
    return kind(value)


def _stop(value) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(s for s in value if s)
    raise ValueError("stop must be a string or a list of strings")

