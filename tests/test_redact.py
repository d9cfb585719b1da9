"""No secret leaves the process (batchspec.redact): credentials at any depth of storage options, in
URLs (user info, signed query strings) and in job files never reach a file the run writes, a report
or a printed plan. End to end on a real S3 endpoint on loopback (moto's server): a run whose
storage options hold keys under client_kwargs, and a run whose INPUT is a presigned S3 URL with a
user and password in it."""

from __future__ import annotations

import json
from pathlib import Path

import fsspec
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from batchspec.cli import cli
from tests.data import prompts_table, write_parquet

MASK = "***"

FAST = ["--spec", "none", "--shard-size", "2", "--max-tokens", "3", "--batch-size", "2"]


def test_urls_lose_user_info_and_signed_query_values_and_nothing_else():
    from batchspec.redact import redact_text

    assert redact_text("s3://bkt/runs/2026-01-02") == "s3://bkt/runs/2026-01-02"
    assert redact_text("read https://bob:hunter2@h:8/a.parquet?X-Amz-Signature=abc&part=1&X-Amz-Credential=AK%2F1#f then") == \
        f"read https://bob:{MASK}@h:8/a.parquet?X-Amz-Signature={MASK}&part=1&X-Amz-Credential={MASK}#f then"
    assert redact_text("https://ghp_TOKEN@github.com/o/r") == f"https://{MASK}@github.com/o/r"
    assert redact_text("az://c/p?sv=2024&sig=S1G&se=2026") == f"az://c/p?sv=2024&sig={MASK}&se=2026"
    assert redact_text("max_tokens must be >= 1, got 0") == "max_tokens must be >= 1, got 0"


def test_credentials_are_masked_at_any_depth_by_the_words_of_their_names():
    from batchspec.redact import redact

    options = {"key": "AK", "secret": "S", "anon": False, "client_kwargs": {"endpoint_url": "http://u:p@h:9",
               "region_name": "r", "config": {"aws_session_token": "T", "retries": 3}}, "headers": [{"Authorization": "Bearer x"}]}
    assert redact(options) == {"key": MASK, "secret": MASK, "anon": False, "client_kwargs": {
        "endpoint_url": f"http://u:{MASK}@h:9", "region_name": "r", "config": {"aws_session_token": MASK, "retries": 3}},
        "headers": [{"Authorization": MASK}]}
    assert redact({"max_num_tokens": 8, "kv_cache_config": {"free_gpu_memory_fraction": 0.9}}) == \
        {"max_num_tokens": 8, "kv_cache_config": {"free_gpu_memory_fraction": 0.9}}


def everything_under(fs, root: str) -> bytes:
    return b"".join(fs.cat_file(p) for p in fs.find(root))


def assert_clean(blob: bytes | str, secrets: list[str]) -> None:
    blob = blob if isinstance(blob, bytes) else blob.encode()
    leaked = [s for s in secrets if s.encode() in blob]
    assert not leaked, leaked


def test_storage_option_secrets_at_depth_stay_out_of_the_bucket_the_report_and_the_terminal(ray_session, tiny_model_dir, s3, tmp_path, monkeypatch):
    url, options, _ = s3
    endpoint = options["client_kwargs"]["endpoint_url"]
    deep = {"client_kwargs": {"endpoint_url": endpoint, "aws_access_key_id": "AKIDDEEPSECRET1", "aws_secret_access_key": "DEEP-SECRET-2"}}
    fs = fsspec.filesystem("s3", **deep)
    write_parquet(fs, f"{url}/in/a.parquet", prompts_table(4))
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(yaml.safe_dump({"model": str(tiny_model_dir), "storage_options": deep,
                                        "worker": {"num_cpus": 0.5, "torch_threads": 1}}))
    secrets = ["AKIDDEEPSECRET1", "DEEP-SECRET-2"]
    args = [f"{url}/in/", f"{url}/out", "--pipeline", str(pipeline), *FAST]
    plan = CliRunner().invoke(cli, ["run", *args, "--plan-only"])
    run = CliRunner().invoke(cli, ["run", *args])
    assert plan.exit_code == 0 and run.exit_code == 0, plan.output + run.output
    assert_clean(plan.output + run.output, secrets)
    manifest = json.loads(fs.cat_file(f"{url}/out/_manifest.json"))
    assert manifest["config"]["storage_options"]["client_kwargs"] == {"endpoint_url": endpoint, "aws_access_key_id": MASK,
                                                                      "aws_secret_access_key": MASK}
    assert_clean(everything_under(fs, f"{url}/out"), secrets)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    page = tmp_path / "r.html"
    report = CliRunner().invoke(cli, ["report", f"{url}/out", "--json", "--html", str(page)])
    assert report.exit_code == 0, report.output
    assert_clean(report.output + page.read_text(), secrets)


def test_a_presigned_input_url_with_a_password_stays_out_of_every_file_report_and_line(ray_session, tiny_model_dir, s3, tmp_path):
    import boto3

    url, options, _ = s3
    endpoint = options["client_kwargs"]["endpoint_url"]
    fs = fsspec.filesystem("s3", **options)
    write_parquet(fs, f"{url}/in/a.parquet", prompts_table(4, with_id=False))
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=options["key"], aws_secret_access_key=options["secret"])
    signed = client.generate_presigned_url("get_object", Params={"Bucket": url[5:], "Key": "in/a.parquet"}, ExpiresIn=3600)
    signature = signed.split("Signature=")[1].split("&")[0]
    input = signed.replace("http://", "http://alice:pw-SECRET-123@")
    secrets = ["pw-SECRET-123", signature]
    out = tmp_path / "out"
    args = [input, str(out), "--model", str(tiny_model_dir), *FAST]
    plan = CliRunner().invoke(cli, ["run", *args, "--plan-only"])
    run = CliRunner().invoke(cli, ["run", *args])
    assert plan.exit_code == 0 and run.exit_code == 0, plan.output + run.output
    files = b"".join(p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file())
    assert_clean(plan.output + run.output, secrets)
    assert_clean(files, secrets)
    assert json.loads((out / "_manifest.json").read_text())["input"].startswith(f"http://alice:{MASK}@127.0.0.1")
    ids = pq.read_table(next((out / "outputs").iterdir())).column("id").to_pylist()
    assert ids[0].startswith("a.parquet#"), ids
    # signed anew (another signature), the same input: the plan's fingerprint does not change
    again = CliRunner().invoke(cli, ["run", input.replace(signature, "ANOTHER-SIGNATURE"), str(out), "--model", str(tiny_model_dir), *FAST])
    assert "different input/plan" not in again.output
    page = tmp_path / "r.html"
    report = CliRunner().invoke(cli, ["report", str(out), "--json", "--html", str(page)])
    assert report.exit_code == 0, report.output
    assert_clean(report.output + page.read_text(), secrets)
    failed = CliRunner().invoke(cli, ["run", input.replace("in/a.parquet", "in/missing.parquet"), str(tmp_path / "o2"), *FAST])
    assert failed.exit_code == 1 and failed.output.strip().startswith("Error: ")
    assert_clean(failed.output, secrets[:1])


def test_submit_dry_run_masks_what_came_from_the_environment_and_every_url_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_SECRET", "from-env-SECRET-1")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "kind": "batchspec-job", "name": "n", "input": "https://u:in-SECRET-2@h/p.parquet?sig=SIG-SECRET-3",
        "output": "s3://b/out/{date}",
        "runtime_env": {"env_vars": {"AWS_X": "${MY_SECRET}", "PLAIN": "1", "HF_TOKEN": "literal-SECRET-4"},
                        "pip": ["pkg", "--extra-index-url https://__token__:pypi-SECRET-5@example.com/simple"]},
        "metadata": {"note": "https://m:meta-SECRET-6@h", "api_key": "meta-SECRET-7"},
    }))
    result = CliRunner().invoke(cli, ["submit", str(job), "--dry-run", "--address", "http://admin:addr-SECRET-8@127.0.0.1:8265"])
    assert result.exit_code == 0, result.output
    assert_clean(result.output, [f"SECRET-{i}" for i in range(1, 9)])
    shown = json.loads(result.output)
    assert shown["runtime_env"]["env_vars"] == {"AWS_X": MASK, "PLAIN": "1", "HF_TOKEN": MASK}
    assert "https://u:***@h/p.parquet?sig=***" in shown["entrypoint"]
