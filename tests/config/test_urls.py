"""Pipeline and job files read from an fsspec URL (a moto S3 server on loopback): relative paths
inside a URL pipeline resolve against the URL's folder. The file itself is read with the ambient
fsspec configuration (fsspec.config / FSSPEC_S3_* / AWS_* variables), since its own
storage_options cannot be read before the file is."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest
import yaml
from click.testing import CliRunner

from batchspec.cli import cli
from batchspec.config.candidates import resolve_spec_arg
from batchspec.config.job import load_job
from batchspec.config.run import build_config, load_pipeline
from batchspec.errors import ConfigError

NGRAM = Path(__file__).resolve().parents[2] / "batchspec" / "data" / "trt_configs" / "ngram.yaml"


@pytest.fixture
def bucket(s3, monkeypatch):
    url, options, _ = s3
    monkeypatch.setitem(fsspec.config.conf, "s3", options)
    fs = fsspec.filesystem("s3")
    return url, fs


def test_pipeline_from_s3_resolves_relative_files_against_its_folder(bucket):
    url, fs = bucket
    fs.pipe(f"{url}/conf/ngram.yaml", NGRAM.read_bytes())
    fs.pipe(f"{url}/conf/cands/mine.yaml", yaml.safe_dump({"candidates": [{"config": "../ngram.yaml", "max_draft_len": [2, 3]}]}).encode())
    fs.pipe(f"{url}/conf/pipeline.yaml", yaml.safe_dump({
        "candidates": "cands/mine.yaml", "spec": "auto", "model": "smollm2-135m", "shard_size": 5,
        "calibration": {"window": 4},
    }).encode())
    config = build_config("in", "out", f"{url}/conf/pipeline.yaml")
    assert config.candidates == f"{url}/conf/cands/mine.yaml"
    assert config.model == "smollm2-135m", "a name that is no file next to the pipeline stays a registry name"
    assert (config.shard_size, dict(config.calibration)) == (5, {"window": 4})
    choice = resolve_spec_arg(config.spec, config.candidates, config.engine, config.draft_model)
    assert [a.label for a in choice.arms] == ["ngram:k=2", "ngram:k=3"]

    result = CliRunner().invoke(cli, ["validate", f"{url}/conf/pipeline.yaml", f"{url}/conf/cands/mine.yaml"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"OK {url}/conf/pipeline.yaml: pipeline, engine torch")


def test_bad_values_in_an_s3_pipeline_name_the_url(bucket):
    url, fs = bucket
    fs.pipe(f"{url}/p.yaml", b"calibration: {margin: high}\n")
    with pytest.raises(ConfigError, match=rf"^{url}/p\.yaml: calibration\.margin: expected a number in \[0, 1\], got 'high'$"):
        load_pipeline(f"{url}/p.yaml")
    with pytest.raises(ConfigError, match=rf"^{url}/missing\.yaml: file not found$"):
        load_pipeline(f"{url}/missing.yaml")


def test_job_file_from_s3(bucket):
    url, fs = bucket
    job = {"kind": "batchspec-job", "name": "nightly", "pipeline": "pipelines/local.yaml", "input": "s3://data/in/",
           "output": "s3://data/runs/{date}", "runtime_env": {"working_dir": "s3://code/batchspec.zip"}}
    fs.pipe(f"{url}/jobs/nightly.yaml", yaml.safe_dump(job).encode())
    spec = load_job(f"{url}/jobs/nightly.yaml")
    assert (spec.name, spec.runtime_env["working_dir"]) == ("nightly", "s3://code/batchspec.zip")
    fs.pipe(f"{url}/jobs/local.yaml", yaml.safe_dump({**job, "runtime_env": {"working_dir": ".."}}).encode())
    with pytest.raises(ConfigError, match=r"runtime_env\.working_dir: expected a URI or an absolute folder for a job file at a URL, got '\.\.'"):
        load_job(f"{url}/jobs/local.yaml")
