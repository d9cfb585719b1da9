"""The data steps without an engine: read (files, columns, row parsing), plan, write."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import posixpath

import fsspec
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchspec.engine.base import NO_SPEC, Completion, SpecConfig
from batchspec.errors import ConfigError, InputError, OutputError
from batchspec.parse import RowDefaults, parse_rows
from batchspec.plan import check_resume, fingerprint, make_plan
from batchspec.read import list_input, open_input
from batchspec.stats import OUTPUT_NAMES, ArmResult, ShardStats
from batchspec.write import (
    Output,
    output_schema,
    output_table,
    resolve_template,
    stats_table,
)
from tests.data import prompts_table, write_parquet

DEFAULTS = RowDefaults(max_tokens=16, temperature=0.0, top_p=1.0, seed=7)


def test_open_input_lists_parquet_files_of_a_folder_in_order(folder):
    source = open_input(str(folder))
    assert [f.rel for f in source.files] == ["a.parquet", "b.parquet"]
    assert source.rows == 10
    assert source.passthrough_schema(OUTPUT_NAMES).names == ["task", "source"]


def test_open_input_accepts_globs_and_file_urls(folder):
    assert [f.rel for f in open_input(f"file://{folder}/b*.parquet").files] == ["b.parquet"]


def test_missing_prompt_column_names_the_columns_found(tmp_path):
    pq.write_table(pa.table({"question": ["hi"]}), tmp_path / "x.parquet")
    with pytest.raises(InputError, match=r"'prompt'.*'messages'.*found \['question'\]"):
        open_input(str(tmp_path / "x.parquet"))


def test_truncated_file_is_an_input_error_naming_it(tmp_path):
    pq.write_table(prompts_table(5), tmp_path / "good.parquet")
    data = (tmp_path / "good.parquet").read_bytes()
    (tmp_path / "bad.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"bad\.parquet is not readable Parquet"):
        open_input(str(tmp_path))


def test_missing_shard_by_column_is_named(folder):
    with pytest.raises(InputError, match=r"--shard-by column 'topic'"):
        open_input(str(folder), shard_by="topic")


def test_passthrough_clash_with_an_output_column_is_refused(tmp_path):
    pq.write_table(pa.table({"prompt": ["a"], "text": ["b"]}), tmp_path / "x.parquet")
    with pytest.raises(InputError, match="'text' clashes"):
        open_input(str(tmp_path / "x.parquet")).passthrough_schema(OUTPUT_NAMES)


def test_plan_fingerprint_is_of_the_listing_and_options_and_another_is_refused(ray_session, folder):
    listing = list_input(str(folder))
    assert [posixpath.basename(p) for p, _ in listing.files] == ["a.parquet", "b.parquet"]
    source = open_input(listing, shard_by="task")
    plan = make_plan(source, "task", 3)
    assert plan.fingerprint == fingerprint(list_input(str(folder)).files, "task", 3), "a listing alone gives the fingerprint"
    check_resume(plan, plan.fingerprint)
    with pytest.raises(OutputError, match=r"different input/plan \(fingerprint .* != .*\); use a new OUTPUT or --no-resume"):
        check_resume(plan, fingerprint(listing.files, "task", 4))


def test_bad_rows_become_errors_not_exceptions():
    table = pa.table({
        "prompt": ["ok", "", None, "ok", "ok", "ok"],
        "temperature": [0.5, None, None, -1.0, None, None],
        "top_p": [None, None, None, None, 1.5, None],
        "max_tokens": [None, None, None, None, None, 0],
    })
    rows = parse_rows(table, [f"r{i}" for i in range(6)], DEFAULTS)
    assert rows[0].error is None and rows[0].request.params.temperature == 0.5 and rows[0].request.params.max_tokens == 16
    assert [r.error for r in rows[1:]] == [
        "prompt is empty",
        "prompt and messages are both null",
        "temperature must be a finite number >= 0, got -1.0",
        "top_p must be in (0, 1], got 1.5",
        "max_tokens must be >= 1, got 0",
    ]
    # the per-row seed comes from the run seed and the id, not the row's position
    assert parse_rows(table.slice(0, 1), ["r0"], DEFAULTS)[0].request.params.seed == rows[0].request.params.seed


def test_messages_rows_parse_and_bad_shapes_are_errors():
    msgs = pa.array([[{"role": "user", "content": "hi"}], [], None], pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])))
    rows = parse_rows(pa.table({"messages": msgs}), ["a", "b", "c"], DEFAULTS)
    assert rows[0].request.messages == ({"role": "user", "content": "hi"},)
    assert rows[1].error.startswith("messages must be a non-empty list")
    assert rows[2].error == "prompt and messages are both null"


def test_a_prompt_is_one_user_message_under_chat_and_text_under_raw_and_messages_stay_messages():
    msgs = pa.array([None, [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]],
                    pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])))
    table = pa.table({"prompt": ["Write a haiku.", None], "messages": msgs})
    chat = parse_rows(table, ["a", "b"], DEFAULTS)
    raw = parse_rows(table, ["a", "b"], dataclasses.replace(DEFAULTS, prompt_format="raw"))
    assert DEFAULTS.prompt_format == "chat"
    assert (chat[0].request.prompt, chat[0].request.messages) == (None, ({"role": "user", "content": "Write a haiku."},))
    assert (raw[0].request.prompt, raw[0].request.messages) == ("Write a haiku.", None)
    assert chat[1].request == raw[1].request and len(raw[1].request.messages) == 2


def _stats(shard_id: str, **more) -> ShardStats:
    return ShardStats(shard_id=shard_id, shard_key=None, rows=1, error_rows=0, engine="torch", model="tiny", batch_size=1, **more)


def test_output_and_stats_tables_keep_one_schema_across_shards(tmp_path):
    out = Output(str(tmp_path / "out"))
    passthrough = pa.schema([("task", pa.string())])
    schema = output_schema(passthrough)
    ok = [Completion("a", "hello", prompt_tokens=3, output_tokens=2, finish_reason="stop")]
    bad = [Completion.failed("b", "prompt is empty")]
    spec = SpecConfig("ngram", 4)
    out.commit_shard("00000", output_table("00000", ok, [spec], pa.table({"task": ["code"]}), schema), stats_table(_stats("00000", candidates=[ArmResult("none", 0, tokens_per_s=9.5, measured=True)])))
    out.commit_shard("00001", output_table("00001", bad, [NO_SPEC], pa.table({"task": [None]}, schema=passthrough), schema), stats_table(_stats("00001")))
    df = pl.scan_parquet(f"{tmp_path}/out/outputs/*.parquet").collect().sort("id")
    assert df.columns == [*OUTPUT_NAMES, "task"]
    assert df["text"].to_list() == ["hello", None]
    assert df["error"].to_list() == [None, "prompt is empty"]
    assert df["spec_method"].to_list() == ["ngram", "none"]
    stats = pl.scan_parquet(f"{tmp_path}/out/stats/*.parquet").collect()
    assert stats.height == 2 and stats["candidates"].to_list()[0][0]["tokens_per_s"] == 9.5
    assert out.committed() == {"00000", "00001"}
    assert not list((tmp_path / "out" / "outputs").glob(".*")), "no temporary files left behind"


def test_date_template_resolves_once_and_rejects_unknown_fields():
    day = dt.date(2026, 3, 4)
    assert resolve_template("s3://b/runs/{date}/out", day) == "s3://b/runs/2026-03-04/out"
    assert resolve_template("out/{yyyy}/{mm}/{dd}", day) == "out/2026/03/04"
    with pytest.raises(ConfigError, match=r"unknown template field 'hour'"):
        resolve_template("out/{hour}", day)


def test_read_plan_and_write_over_s3(ray_session, s3):
    url, options, polars_options = s3
    fs = fsspec.filesystem("s3", **options)
    write_parquet(fs, f"{url}/in/part-0.parquet", prompts_table(5))
    source = open_input(f"{url}/in/", options, shard_by="task")
    plan = make_plan(source, "task", 2)
    assert sum(s.rows for s in plan.shards) == 5
    out = Output(f"{url}/out", tuple(options.items()))
    out.check_writable()
    out.put(out.path("_plan.json"), plan.to_json().encode())
    assert json.loads(fs.cat_file(f"{url}/out/_plan.json"))["fingerprint"] == plan.fingerprint
    missing = Output("s3://no-such-bucket/out", tuple(options.items()))
    with pytest.raises(OutputError, match="cannot write OUTPUT s3://no-such-bucket/out"):
        missing.check_writable()
