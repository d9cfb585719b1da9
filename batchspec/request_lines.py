"""A Batch API request file's lines (JSON lines, `.jsonl`): which lines are requests, and the row
each becomes.

A request file is read as a table of one row per request line (`REQUEST_SCHEMA`; blank lines are
not requests, as vLLM's run-batch skips them): `id` is the line's `custom_id`, `custom_id` and `url`
pass through to the output (what `batchspec export` writes the result lines from), `input_row` is
the line's place among INPUT's requests (the order export writes), `batch_request` is the line's
JSON text, which batchspec.parse maps to a request, and `batch_error` says why a line is not a
request (not UTF-8, not JSON, not an object, no string custom_id), with its file and line number:
such a line is still one row, an error row. Finding the files and reading them by row groups is
batchspec.read's.
"""

from __future__ import annotations

import json
from typing import Iterator

import pyarrow as pa

from batchspec.parse import BATCH_ERROR, BATCH_REQUEST

REQUEST_SUFFIX = ".jsonl"
REQUEST_SCHEMA = pa.schema([
    ("id", pa.string()),  # the line's custom_id (null where it has none: `<file>#<row>`)
    ("custom_id", pa.string()),  # the same, passed through to the output for `batchspec export`
    ("url", pa.string()),  # the line's endpoint, passed through: export writes its response object
    ("input_row", pa.int64()),  # the line's place among INPUT's requests, from 0: export's order
    (BATCH_REQUEST, pa.string()),  # the line's JSON text (batchspec.parse maps it to a request)
    (BATCH_ERROR, pa.string()),  # why the line is not a request, naming file and line (null: it is one)
])


def is_request_file(path: str) -> bool:
    return path.split("?", 1)[0].lower().endswith(REQUEST_SUFFIX)


def request_lines(fh, offset: int = 0, number: int = 1) -> Iterator[tuple[int, int, bytes]]:
    """(byte offset, line number, line) of each request line from `offset`, which is line `number`:
    blank lines are skipped, not requests."""
    for line in fh:
        if line.strip():
            yield offset, number, line
        offset += len(line)
        number += 1


def request_columns(rel: str, number: int, line: bytes) -> dict:
    """One request line's columns; a line that is not a request keeps only its error."""
    where = f"{rel} line {number}"
    try:
        text = line.decode("utf-8-sig" if number == 1 else "utf-8").strip()  # a BOM opens a file, if any
    except UnicodeDecodeError:
        return {BATCH_ERROR: f"{where} is not valid UTF-8"}
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        return {BATCH_ERROR: f"{where} is not valid JSON: {exc.msg} at column {exc.colno}"}
    except RecursionError:
        return {BATCH_ERROR: f"{where} is nested too deeply"}
    if not isinstance(doc, dict):
        return {BATCH_ERROR: f"{where} is not a JSON object: a request line is {{custom_id, method, url, body}}"}
    custom_id, url = doc.get("custom_id"), doc.get("url")
    url = url if isinstance(url, str) else None
    if not isinstance(custom_id, str):
        return {BATCH_ERROR: f"{where}: custom_id must be a string, got {type(custom_id).__name__}"
                             if "custom_id" in doc else f"{where} has no custom_id", "url": url}
    return {"id": custom_id, "custom_id": custom_id, "url": url, BATCH_REQUEST: text}
