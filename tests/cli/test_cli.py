"""The CLI of report, submit, validate and models, driven with click's CliRunner: every command's
--help has examples, successes print what they should, and bad input is one line and exit 1, never
a traceback (unless --debug). The OUTPUT here is written through batchspec.write, the same writer a
run uses, with made-up numbers so the expected table is known; tests/test_report.py covers a real
run's output."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from click.testing import CliRunner

from batchspec.cli import cli
from batchspec.engine.base import NO_SPEC, Completion, SpecConfig
from batchspec.errors import OutputError
from batchspec.stats import ArmResult, Event, ShardStats
from batchspec.write import Output, output_schema, output_table, stats_table

REPO = Path(__file__).resolve().parents[2]


def _shard(out: Output, shard_id: str, key: str, spec: SpecConfig, n: int, errors: int, tps: float, base: float) -> None:
    completions = [Completion(f"{shard_id}-{i}", "text", prompt_tokens=5, output_tokens=8, finish_reason="length",
                              draft_tokens=8 if spec.method != "none" else 0, accepted_tokens=6 if spec.method != "none" else 0,
                              target_steps=2 if spec.method != "none" else 8) for i in range(n - errors)]
    completions += [Completion.failed(f"{shard_id}-e{i}", "prompt too long") for i in range(errors)]
    passthrough = pa.table({"task": [key] * n})
    table = output_table(shard_id, completions, [spec] * n, passthrough, output_schema(passthrough.schema))
    arms = [ArmResult("none", 0, tokens_per_s=base, measured=True),
            ArmResult("ngram", 4, tokens_per_s=tps if spec.method != "none" else base * 0.8, acceptance_rate=0.75,
                      mean_accepted_len=4.0, measured=True)]
    stats = stats_table(ShardStats(shard_id=shard_id, shard_key=key, rows=n, error_rows=errors, spec_method=spec.method,
                                   draft_len=spec.draft_len, acceptance_rate=0.75 if spec.method != "none" else None,
                                   mean_accepted_len=4.0 if spec.method != "none" else 1.0, output_tokens=8 * (n - errors),
                                   decode_s=8 * (n - errors) / tps, prefill_s=0.5, draft_s=0.2, verify_s=1.0,
                                   tokens_per_s=tps, baseline_tokens_per_s=base, calibration_s=1.0, wall_s=4.0,
                                   speedup=tps / base,  # goodput over plain decoding's price for the same tokens
                                   engine="torch", model="tiny", batch_size=4, candidates=arms,
                                   decision_source="calibrated",
                                   events=[Event(0, "start", "none"), Event(2, "switch", "ngram:k=4", 1.4)] if key == "prose" else []))
    out.commit_shard(shard_id, table, stats)


@pytest.fixture
def written_run(tmp_path) -> Path:
    out = Output(str(tmp_path / "run"))
    out.put(out.path("_plan.json"), json.dumps({"shards": [{}, {}]}).encode())
    _shard(out, "00000-code", "code", SpecConfig("ngram", 4), n=4, errors=1, tps=30.0, base=10.0)
    _shard(out, "00001-prose", "prose", NO_SPEC, n=4, errors=0, tps=10.0, base=10.0)
    out.put(out.path("_SUCCESS"), b"")
    return tmp_path / "run"


def invoke(*args, **kwargs):
    return CliRunner().invoke(cli, list(args), **kwargs)


def one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = [line for line in result.output.strip().splitlines() if line.startswith("Error:")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("command", [["report"], ["submit"], ["validate"], ["models"], ["models", "prepare"], ["models", "list"]])
def test_every_help_has_examples(command):
    result = invoke(*command, "--help")
    assert result.exit_code == 0
    assert "Example" in result.output and f"batchspec {command[0]}" in result.output


# ---------------------------------------------------------------------------------------------
# report


def test_report_prints_a_row_per_shard_and_totals(written_run):
    result = invoke("report", str(written_run))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    code = next(line for line in lines if "00000-code" in line)
    prose = next(line for line in lines if "00001-prose" in line)
    total = next(line for line in lines if "total" in line and "2 shards" in line)
    assert " ngram " in code and " 4 " in code and "75%" in code and "3.00x" in code and "25%" in code
    assert " none " in prose and "1.00x" in prose
    assert " calibrated " in code and "calibrated switch@2->ngram:k=4" in prose
    # 24 + 32 tokens over 24/30 + 32/10 s of decode; speedup = (24/10 + 32/10) / (0.8 + 3.2)
    assert " 8 " in total and " 1 " in total and "14.0" in total and "1.40x" in total and "75%" in total
    assert "4.00" in total  # mean accepted length over the shards that speculated
    assert "warning" not in result.output


def test_report_json_and_html(written_run, tmp_path):
    page = tmp_path / "r.html"
    result = invoke("report", str(written_run), "--json", "--html", str(page))
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["totals"]["rows"] == 8 and doc["totals"]["error_rows"] == 1 and doc["totals"]["acceptance_rate"] == 0.75
    assert doc["totals"]["finish_reasons"] == {"error": 1, "length": 7}
    assert [s["chosen"] for s in doc["shards"]] == ["ngram:k=4", "none"]
    assert [a["label"] for a in doc["shards"][0]["candidates"]] == ["none", "ngram:k=4"]
    assert page.read_text().count("data:image/png;base64,") == 3


def test_report_html_path_from_the_environment(written_run, tmp_path):
    page = tmp_path / "env.html"
    result = invoke("report", str(written_run), env={"BATCHSPEC_REPORT_HTML": str(page)})
    assert result.exit_code == 0, result.output
    html = page.read_text()  # the page of this run: its shards, its three plots
    assert html.count("data:image/png;base64,") == 3
    assert all(sid in html for sid in ("00000-code", "00001-prose")), html[:200]


def test_report_warns_about_an_unfinished_run(written_run):
    (written_run / "_SUCCESS").unlink()
    result = invoke("report", str(written_run))
    assert result.exit_code == 0
    assert "run not finished" in result.output and "NOT finished" in result.output


@pytest.mark.parametrize("make,needle", [
    (lambda p: None, "not a batchspec run (no _plan.json and no stats/*.parquet)"),
    (lambda p: (p.mkdir(), (p / "_plan.json").write_text('{"shards": []}')), "no shard is committed yet"),
    (lambda p: (p.mkdir(), (p / "stats").mkdir(), (p / "stats" / "x.parquet").write_text("not parquet")), "cannot read"),
])
def test_report_bad_outputs_are_one_line(tmp_path, make, needle):
    make(tmp_path / "out")
    one_line_error(invoke("report", str(tmp_path / "out")), str(tmp_path / "out") if "cannot" not in needle else "", needle)


def test_report_unwritable_html_is_one_line(written_run, tmp_path):
    (tmp_path / "file").write_text("")
    one_line_error(invoke("report", str(written_run), "--html", str(tmp_path / "file" / "r.html")), "--html", "cannot write")


def test_debug_shows_the_exception(tmp_path):
    result = invoke("--debug", "report", str(tmp_path / "none"))
    assert result.exit_code == 1 and isinstance(result.exception, OutputError)


# ---------------------------------------------------------------------------------------------
# validate


def test_validate_prints_ok_per_file():
    files = [str(REPO / "jobs" / "local.yaml"), str(REPO / "pipelines" / "local.yaml"), str(REPO / "trt_configs" / "ngram.yaml")]
    result = invoke("validate", *files)
    assert result.exit_code == 0, result.output
    assert [line.split(":")[0] for line in result.stdout.splitlines()] == [f"OK {f}" for f in files]


def test_validate_names_each_bad_file_and_exits_1(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"kind": "batchspec-job", "name": "x", "input": "i", "output": "/o", "options": {"max_tokens": -1}}))
    result = invoke("validate", str(REPO / "jobs" / "local.yaml"), str(bad), str(tmp_path / "missing.yaml"))
    assert result.exit_code == 1
    assert f"OK {REPO / 'jobs' / 'local.yaml'}" in result.stdout
    assert f"{bad}: options.max_tokens: expected an integer >= 1, got -1" in result.stderr
    assert f"{tmp_path / 'missing.yaml'}: file not found" in result.stderr
    assert "Error: 2 of 3 file(s) invalid" in result.stderr and "Traceback" not in result.output


def test_validate_needs_a_file():
    result = invoke("validate")
    assert result.exit_code == 2 and "Missing argument" in result.output


# ---------------------------------------------------------------------------------------------
# submit (the real cluster path is tests/test_submit.py)


def test_submit_missing_job_file_is_one_line(tmp_path):
    one_line_error(invoke("submit", str(tmp_path / "nope.yaml")), "nope.yaml", "file not found")


def test_submit_invalid_job_file_is_refused_before_contacting_a_cluster(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"kind": "batchspec-job", "name": "x", "input": "i", "output": "relative/out"}))
    one_line_error(invoke("submit", str(job), "--address", "http://127.0.0.1:1"), "job.yaml: output: expected an absolute path or a URL")


def test_submit_takes_the_address_from_the_environment(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"kind": "batchspec-job", "name": "x", "input": "i", "output": "/tmp/o"}))
    result = invoke("submit", str(job), env={"BATCHSPEC_ADDRESS": "http://127.0.0.1:1", "RAY_ADDRESS": None})
    one_line_error(result, "--address http://127.0.0.1:1: cannot reach the Ray Jobs API")
    result = invoke("submit", str(job), env={"BATCHSPEC_ADDRESS": None, "RAY_ADDRESS": "http://127.0.0.1:2"})
    one_line_error(result, "--address http://127.0.0.1:2: cannot reach")


def test_submit_bad_run_date_is_a_usage_error(tmp_path):
    result = invoke("submit", str(REPO / "jobs" / "local.yaml"), "--run-date", "tomorrow")
    assert result.exit_code == 2 and "expected YYYY-MM-DD, got 'tomorrow'" in result.output


# ---------------------------------------------------------------------------------------------
# models


def test_models_list_and_unknown_model_is_one_line():
    result = invoke("models", "list")
    assert result.exit_code == 0 and "smollm2-135m" in result.stdout
    one_line_error(invoke("models", "prepare", "no-such-model-xyz"), "no-such-model-xyz")


def test_submit_dry_run_prints_the_plan_with_secrets_masked():
    env = {"AWS_ACCESS_KEY_ID": "AKIA-test", "AWS_SECRET_ACCESS_KEY": "s3cret", "BATCHSPEC_ADDRESS": "http://head:8265"}
    result = invoke("submit", str(REPO / "jobs" / "gpu_trtllm.yaml"), "--dry-run", "--run-date", "2026-11-28", env=env)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["address"] == "http://head:8265" and doc["base_id"] == "batchspec-nightly-trtllm-2026-11-28"
    assert doc["output"] == "s3://my-bucket/batchspec/nightly/2026-11-28"
    assert doc["entrypoint"].endswith("--run-date 2026-11-28") and "--pipeline pipelines/gpu_trtllm.yaml" in doc["entrypoint"]
    assert doc["runtime_env"]["env_vars"]["AWS_SECRET_ACCESS_KEY"] == "***" and "s3cret" not in result.output
    missing = invoke("submit", str(REPO / "jobs" / "gpu_trtllm.yaml"), "--dry-run",
                     env={"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None})
    one_line_error(missing, "runtime_env.env_vars.AWS_ACCESS_KEY_ID: ${AWS_ACCESS_KEY_ID} is not set")


def test_report_of_many_shards_plots_a_scatter_and_time_per_key(tmp_path):
    from batchspec.report.load import MAX_PLOTTED, load_report
    from batchspec.report.plots import _time_groups

    out = Output(str(tmp_path / "big"))
    n = MAX_PLOTTED + 10
    for i in range(n):
        spec = SpecConfig("ngram", 2 + i % 3) if i % 2 else NO_SPEC
        _shard(out, f"{i:05d}-k{i % 5}", f"k{i % 5}", spec, n=2, errors=0, tps=10.0 + i % 7, base=10.0)
    page = tmp_path / "big.html"
    result = invoke("report", str(tmp_path / "big"), "--html", str(page))
    assert result.exit_code == 0, result.output
    assert page.read_text().count("data:image/png;base64,") == 3
    groups, title = _time_groups(load_report(str(tmp_path / "big")))
    assert sorted(name for name, _ in groups) == [f"k{i}" for i in range(5)]
    assert f"({n} shards)" in title
    assert sum(sum(split.values()) for _, split in groups) == pytest.approx(4.0 * n)
