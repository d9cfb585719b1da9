"""Structured output at the edges: the `response_format` column (a struct or a JSON string, in the
OpenAI batch shape), the run default (`--response-format FILE.json`, a pipeline key, a job option),
bad values as one-line row or config errors, and a run and a Ray Data stage end to end on the tiny
model: every row that stops is JSON of its schema, read back with polars' `str.json_decode`."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchspec.config.job import run_options
from batchspec.config.run import build_config, default_response_format, load_pipeline
from batchspec.engine.response_format import ANY_OBJECT, parse_response_format
from batchspec.errors import ConfigError
from batchspec.parse import RowDefaults, parse_rows

POINT = {"type": "object", "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9},
                                          "label": {"enum": ["near", "far"]}},
         "required": ["x", "label"], "additionalProperties": False}
AS_JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "point", "schema": POINT, "strict": True}}
DEFAULTS = RowDefaults(max_tokens=8, temperature=0.0, top_p=1.0, seed=None)


def parsed(values: list, defaults: RowDefaults = DEFAULTS, type_: pa.DataType | None = None):
    table = pa.table({"prompt": ["p"] * len(values), "response_format": pa.array(values, type_)})
    return parse_rows(table, [f"r{i}" for i in range(len(values))], defaults)


def test_the_column_as_a_struct_or_a_json_string_gives_the_same_schema_in_the_order_given():
    as_struct, as_text, any_object, text, null = parsed(
        [AS_JSON_SCHEMA, None, None, None, None])[:1] + parsed([json.dumps(AS_JSON_SCHEMA), json.dumps({"type": "json_object"}),
                                                               '{"type": "text"}', None])
    assert as_struct.error is None and as_text.error is None
    assert as_struct.request.response_format == as_text.request.response_format
    assert list(json.loads(as_struct.request.response_format.schema)["properties"]) == ["x", "label"]
    assert as_struct.request.response_format.name == "point"
    assert any_object.request.response_format.schema == ANY_OBJECT
    assert text.request.response_format is None and null.request.response_format is None


def test_a_struct_column_drops_the_null_keys_arrow_adds_for_rows_that_lack_them():
    other = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object", "properties": {"n": {"type": "integer", "maximum": 5}}}}}
    first, second = parsed([AS_JSON_SCHEMA, other])  # one struct type: each row gets the other's keys as nulls
    assert first.request.response_format.schema_dict == POINT
    assert second.request.response_format.schema_dict == other["json_schema"]["schema"]


def test_rows_without_a_response_format_take_the_default_and_a_text_row_opts_out():
    default = parse_response_format(AS_JSON_SCHEMA)
    rows = parsed([None, '{"type": "text"}'], dataclasses.replace(DEFAULTS, response_format=default))
    assert rows[0].request.response_format == default and rows[1].request.response_format is None


@pytest.mark.parametrize("value,problem", [
    ('{"type": "json_schema"', "response_format is a string that is not JSON"),
    ('["json_object"]', "response_format must be an object with a 'type', got list"),
    ('{"type": "xml"}', "response_format.type must be one of json_schema, json_object, text, got 'xml'"),
    ('{"type": "json_schema"}', "response_format.json_schema must be an object with a 'schema', got NoneType"),
    ('{"type": "json_schema", "json_schema": {"name": "x"}}', "response_format.json_schema.schema must be a JSON object, got NoneType"),
    ('{"type": "json_schema", "json_schema": {"schema": [1]}}', "response_format.json_schema.schema must be a JSON object, got list"),
    ('{"type": "json_schema", "json_schema": {"schema": "{bad"}}', "response_format.json_schema.schema is a string that is not JSON"),
])
def test_a_response_format_of_the_wrong_shape_is_that_rows_one_line_error(value, problem):
    bad, good = parsed([value, json.dumps(AS_JSON_SCHEMA)])
    assert bad.error.startswith(problem) and "\n" not in bad.error
    assert good.error is None


def test_the_run_default_is_a_json_file_checked_at_the_edge(tmp_path):
    good = tmp_path / "point.json"
    good.write_text(json.dumps(AS_JSON_SCHEMA))
    config = build_config("", "", response_format=str(good))
    assert default_response_format(config).schema_dict == POINT
    (tmp_path / "bad.json").write_text('{"type": "json_schema", "json_schema": {"schema": 3}}')
    with pytest.raises(ConfigError, match=r"^--response-format: .*bad.json: response_format.json_schema.schema must be a JSON object, got int$"):
        build_config("", "", response_format=str(tmp_path / "bad.json"))
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ConfigError, match=r"^--response-format: .*broken.json is a string that is not JSON"):
        build_config("", "", response_format=str(tmp_path / "broken.json"))
    with pytest.raises(ConfigError, match=r"^--response-format: cannot read .*missing.json"):
        build_config("", "", response_format=str(tmp_path / "missing.json"))
    # a schema of the right shape that the torch engine's grammar library cannot compile: refused
    # here, not as every row's error; TensorRT-LLM's backend (xgrammar by default) gives its own
    unresolved = {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"a": {"$ref": "#/nope"}}}}}
    (tmp_path / "unresolved.json").write_text(json.dumps(unresolved))
    with pytest.raises(ConfigError, match=r"^--response-format: .*unresolved.json: response_format: the schema cannot be compiled: .*/nope"):
        build_config("", "", response_format=str(tmp_path / "unresolved.json"))
    assert default_response_format(dataclasses.replace(config, engine="trtllm", response_format=str(tmp_path / "unresolved.json")))


def test_a_pipeline_file_names_the_default_relative_to_itself_and_a_job_may_set_it(tmp_path):
    (tmp_path / "point.json").write_text(json.dumps(AS_JSON_SCHEMA))
    (tmp_path / "p.yaml").write_text("response_format: point.json\n")
    assert load_pipeline(tmp_path / "p.yaml")["response_format"] == str(tmp_path / "point.json")
    config = build_config("", "", pipeline=str(tmp_path / "p.yaml"))
    assert default_response_format(config).name == "point"
    (tmp_path / "q.yaml").write_text("response_format: nowhere.json\n")
    with pytest.raises(ConfigError, match=r"q.yaml: response_format: cannot read nowhere.json"):
        build_config("", "", pipeline=str(tmp_path / "q.yaml"))
    assert "response_format" in run_options()


# -- end to end on the tiny model ----------------------------------------------------------------


def structured_table(n: int = 8) -> pa.Table:
    """Rows with a struct response_format, rows that take the default (null), one that opts out,
    and one whose schema the grammar library cannot compile."""
    formats = [AS_JSON_SCHEMA if i % 3 == 0 else None for i in range(n)]
    formats[1] = {"type": "text"}
    formats[2] = {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "strin"}}}
    return pa.table({"id": [f"row-{i}" for i in range(n)], "prompt": [f"Point {i}: x is {i - 4}" for i in range(n)],
                     "task": ["a", "b"] * (n // 2), "response_format": pa.array([None if f is None else json.dumps(f) for f in formats])})


def check_outputs(df: pl.DataFrame, n: int = 8) -> None:
    assert sorted(df["id"].to_list()) == [f"row-{i}" for i in range(n)]
    by_id = {r["id"]: r for r in df.to_dicts()}
    assert by_id["row-2"]["finish_reason"] == "error" and "cannot be compiled" in by_id["row-2"]["error"]
    assert by_id["row-1"]["finish_reason"] != "error"  # unconstrained
    constrained = df.filter(~pl.col("id").is_in(["row-1", "row-2"]))
    assert (constrained["finish_reason"] == "stop").all()
    decoded = constrained.with_columns(pl.col("text").str.json_decode(pl.Struct({"x": pl.Int64, "label": pl.String})).alias("point"))
    for text in constrained["text"]:
        jsonschema.validate(json.loads(text), POINT)
    assert decoded["point"].struct.field("label").is_in(["near", "far"]).all()


def test_a_run_constrains_its_rows_and_counts_them_in_the_stats(ray_session, tiny_model_dir, tmp_path):
    from batchspec.pipeline import run
    from tests.test_pipeline import make_config

    (tmp_path / "in").mkdir()
    pq.write_table(structured_table(), tmp_path / "in" / "part-0.parquet")
    (tmp_path / "point.json").write_text(json.dumps(AS_JSON_SCHEMA))
    out = tmp_path / "out"
    run(make_config(tmp_path / "in", out, tiny_model_dir, max_tokens=40, response_format=str(tmp_path / "point.json")))
    check_outputs(pl.read_parquet(f"{out}/outputs/*.parquet"))
    stats = pl.read_parquet(f"{out}/stats/*.parquet")
    assert stats["constrained_rows"].sum() == 7  # every row but the one that opted out (the bad one counts: it asked)
    assert stats["forced_tokens"].sum() <= stats["accepted_tokens"].sum()


def test_the_ray_data_stage_takes_the_column_and_the_default(ray_session, tiny_model_dir, tmp_path):
    import ray

    from batchspec.ray_data import generate
    from tests.test_ray_data import config_for

    (tmp_path / "point.json").write_text(json.dumps(AS_JSON_SCHEMA))
    config = config_for(tiny_model_dir, max_tokens=40, response_format=str(tmp_path / "point.json"))
    out = generate(ray.data.from_items(structured_table().to_pylist()), config).take_all()
    check_outputs(pl.DataFrame(out).drop("task"))
