"""`batchspec calibrate`: the arm table per shard key, and one-line errors."""

from __future__ import annotations


def test_calibrate_command_prints_the_arm_table_per_key(tmp_path, tiny_model_dir):
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq
    from click.testing import CliRunner

    from batchspec.cli import cli

    rows = [{"id": f"r{i}", "task": "copy" if i % 2 else "other", "prompt": f"alpha beta gamma {i} alpha beta"} for i in range(12)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")
    args = ["calibrate", str(tmp_path / "in.parquet"), "--model", str(tiny_model_dir), "--shard-by", "task",
            "--batch-size", "2", "--max-tokens", "6"]
    result = CliRunner().invoke(cli, args + ["--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [d["shard_key"] for d in doc] == ["copy", "other"]
    for d in doc:
        assert d["rows"] == 6 and d["arms"][0]["label"] == "none" and d["arms"][0]["measured"]
        assert d["chosen"] in {a["label"] for a in d["arms"]}
    table = CliRunner().invoke(cli, args)
    assert table.exit_code == 0 and "shard key 'copy'" in table.output and "choice:" in table.output


def test_calibrate_command_errors_are_one_line(tmp_path):
    from click.testing import CliRunner

    from batchspec.cli import cli

    result = CliRunner().invoke(cli, ["calibrate", str(tmp_path / "missing.parquet")])
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:"), result.output


def test_calibrate_names_the_sampled_rows_that_will_fail_and_calibrates_the_rest(tmp_path, tiny_model_dir):
    """Poison cells (an infinite max_tokens, a prompt that is not UTF-8) fail their rows alone; a key
    none of whose sampled rows can run is reported, not a traceback, and the other keys calibrate."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq
    from click.testing import CliRunner

    from batchspec.cli import cli

    prompts = pa.array([b"alpha beta gamma", b"bad \xff", b"alpha beta", b"delta", b"\xfe"], pa.binary()).view(pa.string())
    table = pa.table({"id": [f"r{i}" for i in range(5)], "task": ["a", "a", "a", "b", "b"], "prompt": prompts,
                      "max_tokens": [4.0, None, float("inf"), float("nan"), None]})
    pq.write_table(table, tmp_path / "in.parquet")
    args = ["calibrate", str(tmp_path / "in.parquet"), "--model", str(tiny_model_dir), "--shard-by", "task",
            "--batch-size", "2", "--max-tokens", "4", "--spec", "none"]
    result = CliRunner().invoke(cli, args + ["--json"])
    assert result.exit_code == 0, result.output
    a, b = json.loads(result.stdout)
    assert (a["shard_key"], a["sampled"], a["failing_rows"], a["first_failure"]) == ("a", 1, 2, "r1: prompt is not valid UTF-8")
    assert (b["shard_key"], b["sampled"], b["failing_rows"], b["chosen"]) == ("b", 0, 2, None)
    assert b["first_failure"] == "r3: max_tokens must be a finite integer, got nan"
    table = CliRunner().invoke(cli, args)
    assert table.exit_code == 0, table.output
    assert "2 of the 3 sampled rows of key 'a' will fail (first r1: prompt is not valid UTF-8)" in table.output
    assert "none of the 2 sampled rows of key 'b' can run (first r3: max_tokens must be a finite integer, got nan)" in table.output
