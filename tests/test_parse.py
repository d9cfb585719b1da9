"""Poison cells: whatever a cell holds, parsing gives its row a one-line error and the other rows
run (batchspec.parse). Each case here once raised out of `parse_rows` and failed its whole shard."""

from __future__ import annotations

import pyarrow as pa
import pytest

from batchspec.parse import RowDefaults, parse_rows

DEFAULTS = RowDefaults(max_tokens=16, temperature=0.0, top_p=1.0, seed=7)
CHAT = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))


def parsed(table: pa.Table, defaults: RowDefaults = DEFAULTS):
    return parse_rows(table, [f"r{i}" for i in range(table.num_rows)], defaults)


def nested(depth: int) -> str:
    """A response_format JSON string whose schema nests `depth` objects (written without recursion)."""
    schema = '{"type":"string"}'
    for _ in range(depth):
        schema = '{"type":"object","properties":{"a":' + schema + "}}"
    return '{"type":"json_schema","json_schema":{"name":"deep","schema":' + schema + "}}"


def deep_struct(depth: int) -> pa.Array:
    """A response_format struct column whose schema nests `depth` objects (built without recursion)."""
    schema = pa.array(["string", "string"])
    for _ in range(depth):
        schema = pa.StructArray.from_arrays([pa.array(["object"] * 2), pa.StructArray.from_arrays([schema], ["a"])], ["type", "properties"])
    spec = pa.StructArray.from_arrays([pa.array(["deep"] * 2), schema], ["name", "schema"])
    return pa.StructArray.from_arrays([pa.array(["json_schema"] * 2), spec], ["type", "json_schema"], mask=pa.array([True, False]))


def invalid_utf8(values: list[bytes]) -> pa.Array:
    """A string column holding bytes that are not UTF-8 (Parquet readers do not check)."""
    return pa.array(values, pa.binary()).view(pa.string())


@pytest.mark.parametrize(("column", "cells", "message"), [
    ("max_tokens", pa.array([8.0, float("inf")]), "max_tokens must be a finite integer, got inf"),
    ("max_tokens", pa.array([8.0, float("nan")]), "max_tokens must be a finite integer, got nan"),
    ("seed", pa.array([1, 2**64], pa.decimal128(38, 0)).cast(pa.float64()), "seed must be an integer in [0, 2**64), got 1.8446744073709552e+19"),
    ("seed", pa.array([1, 2**64 - 1], pa.uint64()), None),
    ("seed", pa.array([1, -1]), "seed must be an integer in [0, 2**64), got -1"),
    ("top_p", pa.array([1.0, 1e-50]), "top_p must be in (0, 1] and above 0 in float32 (at least 1.4e-45), got 1e-50"),
    ("temperature", pa.array([0.0, float("nan")]), "temperature must be a finite number >= 0, got nan"),
    ("response_format", pa.array([None, nested(2000)]), "response_format is nested too deeply"),
    ("response_format", "deep struct", "response_format is nested too deeply"),
    ("prompt", invalid_utf8([b"fine", b"bad \xff\xfe here"]), "prompt is not valid UTF-8"),
])
def test_a_poison_cell_fails_its_row_alone(column, cells, message):
    table = pa.table({"prompt": ["first row", "second row"]})
    cells = deep_struct(400) if isinstance(cells, str) else cells
    table = table.set_column(0, "prompt", cells) if column == "prompt" else table.append_column(column, cells)
    rows = parsed(table)
    assert rows[0].error is None, rows[0].error
    if message is None:
        assert rows[1].error is None and rows[1].request.params.seed == 2**64 - 1
        return
    assert rows[1].error is not None and rows[1].error.startswith(message), rows[1].error
    assert "\n" not in rows[1].error and len(rows[1].error) <= 300


def test_a_column_of_invalid_utf8_in_messages_or_stop_fails_only_those_rows():
    table = pa.table({
        "messages": pa.array([[{"role": "user", "content": "hi"}], [{"role": "user", "content": "yo"}]], CHAT),
        "stop": invalid_utf8([b"\n", b"\xc3\x28"]),
    })
    rows = parsed(table)
    assert rows[0].error is None and rows[0].request.params.stop == ("\n",)
    assert rows[1].error == "stop is not valid UTF-8"


def test_chat_roles_are_checked_and_prompt_with_messages_is_refused():
    table = pa.table({
        "prompt": [None, None, "also a prompt", None],
        "messages": pa.array([
            [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
            [{"role": "wizard", "content": "hi"}],
            [{"role": "user", "content": "hi"}],
            [{"role": "tool", "content": "42"}, {"role": "user", "content": "and?"}],
        ], CHAT),
    })
    rows = parsed(table)
    assert rows[0].error is None and rows[3].error is None
    assert rows[1].error == "messages[0].role must be one of system, user, assistant, tool; got 'wizard'"
    assert rows[2].error == "prompt and messages are both set; give one"


def test_an_unexpected_failure_while_parsing_a_cell_is_that_rows_error(monkeypatch):
    """Whatever raises while a row is parsed (here a bug stand-in) stays the row's one line."""
    from batchspec import parse

    real = parse._stop

    def flaky(value):
        if value == "boom":
            raise KeyError("a surprise")
        return real(value)

    monkeypatch.setattr(parse, "_stop", flaky)
    rows = parsed(pa.table({"prompt": ["a", "b"], "stop": ["x", "boom"]}))
    assert rows[0].error is None
    assert rows[1].error == "row cannot be parsed: KeyError: 'a surprise'"
