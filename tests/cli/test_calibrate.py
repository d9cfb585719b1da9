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
