"""The pipeline file's typed model: RunConfig, WorkerConfig and CalibrationSettings, each key checked
for type and range at load by the one validator that reads the dataclass fields and their declared
metadata. The same check runs for `run`, `calibrate`, `validate` and `submit` (a job's pipeline)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from batchspec.calibrate import CalibrationSettings
from batchspec.cli import cli
from batchspec.config.kit import check, model_of
from batchspec.config.run import FIELDS, WORKER_FIELDS, RunConfig, WorkerConfig, build_config, load_pipeline
from batchspec.config.validate import validate_one
from batchspec.errors import ConfigError
from tests.data import prompts_table


def check_fields(where: str, key: str, cls: type, value: dict) -> dict:
    """The keys of `value` checked by the model of the dataclass `cls`, as a pipeline's section is."""
    section = check(model_of(cls), value, where, key=key)
    return {name: getattr(section, name) for name in value}


def _pipeline(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("section,message", [
    ({"margin": "high"}, "calibration.margin: expected a number in [0, 1], got 'high'"),
    ({"window": -3}, "calibration.window: expected an integer >= 0, got -3"),
    ({"measure_steps": 0}, "calibration.measure_steps: expected an integer >= 1, got 0"),
    ({"measure_steps": 2.5}, "calibration.measure_steps: expected an integer >= 1, got 2.5"),
    ({"max_fraction": 1.5}, "calibration.max_fraction: expected a number in [0, 1], got 1.5"),
    ({"margin": float("nan")}, "calibration.margin: expected a number in [0, 1], got nan"),
    ({"window": True}, "calibration.window: expected an integer >= 0, got True"),
    ({"max_builds_per_worker": 1}, "calibration.max_builds_per_worker: expected an integer >= 2, got 1"),
    ({"sample_size": 8}, "calibration.sample_size: unknown key; expected one of margin, window"),
    ([1, 2], "calibration: expected a mapping of margin, window"),
])
def test_bad_calibration_values_name_file_key_value_and_expectation(tmp_path, section, message):
    path = _pipeline(tmp_path, {"calibration": section})
    with pytest.raises(ConfigError) as err:
        load_pipeline(path)
    assert str(err.value) == f"{path}: {message}" or str(err.value).startswith(f"{path}: {message}"), str(err.value)
    with pytest.raises(ConfigError, match="calibration"):  # the same check through `batchspec validate`
        validate_one(str(path))


def test_good_calibration_values_are_converted_and_reach_the_settings(tmp_path):
    path = _pipeline(tmp_path, {"calibration": {"margin": 0, "window": 8, "measure_steps": 4}})
    config = build_config("in", "out", str(path))
    settings = CalibrationSettings(**dict(config.calibration))
    assert (settings.margin, settings.window, settings.measure_steps) == (0.0, 8, 4)
    assert isinstance(settings.margin, float)


def test_every_calibration_field_is_checked_at_its_declared_bounds():
    """Driven by the dataclass: a field added to CalibrationSettings is covered by declaring it."""
    rules = model_of(CalibrationSettings).model_fields
    assert list(rules) == [f.name for f in dataclasses.fields(CalibrationSettings)]
    for f in dataclasses.fields(CalibrationSettings):
        fields = {f.name: f.default}
        assert check_fields("p.yaml", "calibration", CalibrationSettings, fields) == fields  # the default is valid
        for bad in ("text", None, [f.default]):
            with pytest.raises(ConfigError, match=rf"^p\.yaml: calibration\.{f.name}: expected "):
                check_fields("p.yaml", "calibration", CalibrationSettings, {f.name: bad})
        if "min" in f.metadata:
            with pytest.raises(ConfigError, match=rf"calibration\.{f.name}: expected .*>= {f.metadata['min']}|in \["):
                check_fields("p.yaml", "calibration", CalibrationSettings, {f.name: f.metadata["min"] - 1})
        if "max" in f.metadata:
            with pytest.raises(ConfigError, match=rf"calibration\.{f.name}: expected .*{f.metadata['max']}\]"):
                check_fields("p.yaml", "calibration", CalibrationSettings, {f.name: f.metadata["max"] + 0.5})


def test_a_new_field_needs_only_its_declaration():
    @dataclasses.dataclass(frozen=True)
    class Settings:
        window: int = dataclasses.field(default=4, metadata={"min": 2})
        ratio: float | None = dataclasses.field(default=None, metadata={"above": 0, "max": 1})

    assert check_fields("f.yaml", "s", Settings, {"window": 2, "ratio": 1}) == {"window": 2, "ratio": 1.0}
    assert check_fields("f.yaml", "s", Settings, {"ratio": None}) == {"ratio": None}
    with pytest.raises(ConfigError, match=r"^f\.yaml: s\.window: expected an integer >= 2, got 1$"):
        check_fields("f.yaml", "s", Settings, {"window": 1})
    with pytest.raises(ConfigError, match=r"^f\.yaml: s\.ratio: expected a number in \(0, 1\] or null, got 0$"):
        check_fields("f.yaml", "s", Settings, {"ratio": 0})


@pytest.mark.parametrize("doc,message", [
    ({"worker": {"num_cpus": -1}}, "worker.num_cpus: expected a number >= 0, got -1"),
    ({"worker": {"torch_threads": 0}}, "worker.torch_threads: expected an integer >= 1 or null, got 0"),
    ({"worker": {"max_attempts": "3"}}, "worker.max_attempts: expected an integer >= 1, got '3'"),
    ({"worker": {"wait_for_workers_s": "soon"}}, "worker.wait_for_workers_s: expected a number >= 0, got 'soon'"),
    ({"worker": {"suffix_tree_mb": 0}}, "worker.suffix_tree_mb: expected a number in [1, 65536], got 0"),
    ({"ray_num_cpus": 0}, "ray_num_cpus: expected an integer >= 1 or null, got 0"),
    ({"top_p": 0}, "top_p: expected a number in (0, 1] that float32 does not round to 0, got 0"),
    ({"top_p": 1e-50}, "top_p: expected a number in (0, 1] that float32 does not round to 0, got 1e-50"),
    ({"seed": 2**64}, "seed: expected an integer in [0, 18446744073709551615] or null, got 18446744073709551616"),
    ({"seed": -1}, "seed: expected an integer in [0, 18446744073709551615] or null, got -1"),
    ({"temperature": -0.1}, "temperature: expected a number >= 0, got -0.1"),
    ({"engine": "vllm"}, "engine: expected one of torch, trtllm, got 'vllm'"),
    ({"dtype": "int8"}, "dtype: expected one of float32, bfloat16, float16, got 'int8'"),
    ({"run_date": "today"}, "run_date: expected a date YYYY-MM-DD or null, got 'today'"),
    ({"keep_shards": "yes"}, "keep_shards: expected true or false, got 'yes'"),
    ({"storage_options": ["x"]}, "storage_options: expected a mapping of fsspec options, got ['x']"),
    ({"model": ""}, "model: expected a model name, folder or URL, got ''"),
    ({"shard_sise": 4}, "unknown key 'shard_sise'; expected one of engine, model"),
])
def test_bad_pipeline_values_name_file_key_value_and_expectation(tmp_path, doc, message):
    path = _pipeline(tmp_path, doc)
    with pytest.raises(ConfigError) as err:
        load_pipeline(path)
    assert str(err.value).startswith(f"{path}: {message}"), str(err.value)


def test_every_field_has_one_rule():
    names = {f.name for f in dataclasses.fields(RunConfig)}
    assert set(FIELDS) == names - {"input", "output", "pipeline", "worker", "calibration"}
    assert set(WORKER_FIELDS) == {f.name for f in dataclasses.fields(WorkerConfig)}


def test_bad_calibration_stops_validate_run_and_submit_before_anything_is_written(tmp_path):
    path = _pipeline(tmp_path, {"calibration": {"margin": "high", "window": -3}})
    runner = CliRunner()
    result = runner.invoke(cli, ["validate", str(path)])
    assert result.exit_code == 1 and "OK" not in result.stdout
    assert f"{path}: calibration.margin: expected a number in [0, 1], got 'high'" in result.stderr

    pq.write_table(prompts_table(2), tmp_path / "in.parquet")
    out = tmp_path / "out"
    for command in (["run", str(tmp_path / "in.parquet"), str(out)], ["calibrate", str(tmp_path / "in.parquet")]):
        result = runner.invoke(cli, [*command, "--pipeline", str(path)])
        assert result.exit_code == 1, result.output
        assert result.output.strip().splitlines() == [f"Error: {path}: calibration.margin: expected a number in [0, 1], got 'high'"]
    assert not out.exists()

    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"kind": "batchspec-job", "name": "j", "pipeline": "p.yaml", "input": "in.parquet",
                                   "output": str(out), "runtime_env": {"working_dir": "."}}))
    result = runner.invoke(cli, ["submit", str(job), "--address", "http://127.0.0.1:1"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [f"Error: {job}: pipeline: {path}: calibration.margin: expected a number in [0, 1], got 'high'"]
