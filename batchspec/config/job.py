"""The batchspec job file (jobs/*.yaml): what `batchspec submit` runs on a Ray cluster.

    kind: batchspec-job            # required: how `batchspec validate` recognises it
    name: nightly-trtllm           # lowercase letters, digits, '-'; names the Ray submission id
    address: null                  # optional; --address, BATCHSPEC_ADDRESS and RAY_ADDRESS win
    pipeline: pipelines/gpu_trtllm.yaml   # as seen from the job's working directory
    input: s3://bucket/prompts/
    output: s3://bucket/runs/{date}       # {date} {yyyy} {mm} {dd}: batchspec.write templates
    options: {shard_by: task, prior_run: "s3://bucket/runs/{date}"}   # any `batchspec run` option,
                                   # by its long name; this prior_run: the newest earlier night
    resources: {entrypoint_num_cpus: 1, entrypoint_num_gpus: 0, entrypoint_memory: null,
                entrypoint_resources: {}}   # for the driver only; workers: the pipeline's worker:
    runtime_env: {working_dir: .., excludes: [...], pip: [...], env_vars: {K: "v" | "${K}"}}
    metadata: {team: data}         # optional strings, shown by `ray job list`

Paths: `runtime_env.working_dir` is relative to the job file; `pipeline` and `input` are relative
to that working directory (the job runs in an uploaded copy of it). `output` must be absolute or
a URL, since a relative one would land inside Ray's session folder and vanish with it.
`${NAME}` in an env_vars value is read from the submitter's environment at submit time, so
credentials stay out of the file.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchspec.config.kit import read_yaml
from batchspec.config.run import FIELDS, validate_pipeline_file
from batchspec.errors import ConfigError
from batchspec.redact import redact_text
from batchspec.write import resolve_template

JOB_KIND = "batchspec-job"
KEYS = ("kind", "name", "address", "pipeline", "input", "output", "options", "resources", "runtime_env", "metadata")
RESOURCE_KEYS = ("entrypoint_num_cpus", "entrypoint_num_gpus", "entrypoint_memory", "entrypoint_resources")
RUNTIME_ENV_KEYS = ("working_dir", "py_modules", "pip", "uv", "conda", "env_vars", "excludes", "image_uri", "config")
NOT_OPTIONS = ("device", "ray_address", "ray_num_cpus", "calibration", "storage_options", "llm_options",
               "strict_speculation")  # pipeline-file only
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,46}[a-z0-9])?$")


@dataclass(frozen=True)
class JobSpec:
    """A validated job file. `options` are `batchspec run` options by their Python name."""

    path: str
    name: str
    input: str
    output: str
    pipeline: str | None = None
    address: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    resources: dict[str, Any] = field(default_factory=dict)
    runtime_env: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)

    def summary(self) -> str:
        where = self.runtime_env.get("working_dir") or "no working_dir"
        return redact_text(f"{self.path}: batchspec job {self.name}, {self.input} -> {self.output}, "
                           f"pipeline {self.pipeline or 'default'}, working_dir {where}")


def is_job_doc(data: Any) -> bool:
    return isinstance(data, dict) and data.get("kind") == JOB_KIND


def load_job(path: str | os.PathLike) -> JobSpec:
    """Read and validate a job file once; ConfigError names the file, the key and the expectation."""
    path = str(path)
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with kind: {JOB_KIND}, got {type(data).__name__}")
    return parse_job(path, data)


def parse_job(path: str, data: dict) -> JobSpec:
    if data.get("kind") != JOB_KIND:
        raise ConfigError(f"{path}: kind: expected {JOB_KIND!r}, got {data.get('kind')!r}")
    unknown = [k for k in data if k not in KEYS]
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r}; expected one of {', '.join(KEYS)}")
    name = data.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"{path}: name: expected lowercase letters, digits and '-' (at most 48), got {name!r}")
    for key in ("input", "output"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise ConfigError(f"{path}: {key}: expected a path or URL, got {data.get(key)!r}")
    _check_template(path, "input", data["input"])
    _check_template(path, "output", data["output"])
    _check_absolute(path, "output", data["output"])
    for key in ("pipeline", "address"):
        if data.get(key) is not None and (not isinstance(data[key], str) or not data[key]):
            raise ConfigError(f"{path}: {key}: expected a string or null, got {data[key]!r}")
    runtime_env = _runtime_env(path, data.get("runtime_env"))
    job = JobSpec(
        path=path, name=name, input=data["input"], output=data["output"], pipeline=data.get("pipeline"),
        address=data.get("address"), options=_options(path, data.get("options")),
        resources=_resources(path, data.get("resources")), runtime_env=runtime_env,
        metadata=_string_map(path, "metadata", data.get("metadata")),
    )
    if job.options.get("prior_run") is not None:  # the OUTPUT of an earlier run: a path as output's
        _check_template(path, "options.prior_run", job.options["prior_run"])
        _check_absolute(path, "options.prior_run", job.options["prior_run"])
    _check_pipeline(job)
    return job


def _check_template(path: str, key: str, value: str) -> None:
    try:
        resolve_template(value, dt.date(2000, 1, 1))
    except ConfigError:
        raise ConfigError(f"{path}: {key}: unknown template field in {value!r}; expected {{date}}, {{yyyy}}, {{mm}} or {{dd}}") from None


def _check_absolute(path: str, key: str, value: str) -> None:
    if "://" not in value and not os.path.isabs(value):
        raise ConfigError(f"{path}: {key}: expected an absolute path or a URL (the job runs in a copy of working_dir), got {value!r}")


def run_options() -> tuple[str, ...]:
    """The `batchspec run` options a job may set, by Python name: the pipeline fields the command
    line exposes (the CLI's own options are checked against this list in tests)."""
    return tuple(name for name in FIELDS if name not in NOT_OPTIONS)


def _options(path: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: options: expected a mapping of batchspec run options, got {value!r}")
    known = run_options()
    out = {}
    for key, v in value.items():
        name = str(key).replace("-", "_")
        if name not in known:
            raise ConfigError(f"{path}: options.{key}: unknown option; expected one of {', '.join(sorted(known))}")
        if name == "run_date":
            try:
                v = dt.date.fromisoformat(str(v)).isoformat()
            except ValueError:
                raise ConfigError(f"{path}: options.run_date: expected a date YYYY-MM-DD, got {v!r}") from None
        elif name in FIELDS:
            expected, check = FIELDS[name]
            try:
                check(v)
            except (ValueError, TypeError):
                raise ConfigError(f"{path}: options.{key}: expected {expected}, got {v!r}") from None
        out[name] = v
    return out


def _resources(path: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: resources: expected a mapping of {', '.join(RESOURCE_KEYS)}, got {value!r}")
    out = {}
    for key, v in value.items():
        if key not in RESOURCE_KEYS:
            raise ConfigError(f"{path}: resources.{key}: unknown key; expected one of {', '.join(RESOURCE_KEYS)}")
        if v is None:
            continue
        if key == "entrypoint_resources":
            if not isinstance(v, dict) or not all(isinstance(n, (int, float)) and not isinstance(n, bool) and n >= 0 for n in v.values()):
                raise ConfigError(f"{path}: resources.{key}: expected a mapping of resource name to a number >= 0, got {v!r}")
        elif key == "entrypoint_memory":
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"{path}: resources.{key}: expected bytes as an integer >= 0, got {v!r}")
        elif isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise ConfigError(f"{path}: resources.{key}: expected a number >= 0, got {v!r}")
        out[key] = v
    return out


def _runtime_env(path: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: runtime_env: expected a mapping, got {value!r}")
    out = dict(value)
    for key in value:
        if key not in RUNTIME_ENV_KEYS:
            raise ConfigError(f"{path}: runtime_env.{key}: unknown key; expected one of {', '.join(RUNTIME_ENV_KEYS)}")
    wd = value.get("working_dir")
    if wd is not None:
        if not isinstance(wd, str) or not wd:
            raise ConfigError(f"{path}: runtime_env.working_dir: expected a folder or a URI, got {wd!r}")
        if "://" in path and "://" not in wd and not os.path.isabs(wd):
            raise ConfigError(f"{path}: runtime_env.working_dir: expected a URI or an absolute folder for a job file at a URL, got {wd!r}")
        if "://" not in wd:
            local = (Path(path).resolve().parent / wd).resolve()
            if not local.is_dir():
                raise ConfigError(f"{path}: runtime_env.working_dir: expected a folder (relative to the job file), {local} is not one")
            out["working_dir"] = str(local)
    for key in ("excludes", "py_modules"):
        if key in value and (not isinstance(value[key], list) or not all(isinstance(x, str) for x in value[key])):
            raise ConfigError(f"{path}: runtime_env.{key}: expected a list of strings, got {value[key]!r}")
    pip = value.get("pip")
    if pip is not None and not (isinstance(pip, list) and all(isinstance(x, str) for x in pip)) and not isinstance(pip, (str, dict)):
        raise ConfigError(f"{path}: runtime_env.pip: expected a list of requirements, a requirements file or a mapping, got {pip!r}")
    if "env_vars" in value:
        out["env_vars"] = _string_map(path, "runtime_env.env_vars", value["env_vars"])
    return out


def _string_map(path: str, key: str, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: {key}: expected a mapping of names to strings, got {value!r}")
    for k, v in value.items():
        if not isinstance(v, str):
            raise ConfigError(f"{path}: {key}.{k}: expected a string (quote numbers: \"1\"), got {v!r}")
    return {str(k): v for k, v in value.items()}


def _check_pipeline(job: JobSpec) -> None:
    """Validate the pipeline file now when it can be seen from here (local working_dir or path)."""
    if job.pipeline is None or "://" in job.pipeline:
        return
    wd = job.runtime_env.get("working_dir")
    if os.path.isabs(job.pipeline):
        local = Path(job.pipeline)
    elif wd is None or "://" in wd:
        return  # resolved on the cluster, in a working directory we cannot see
    else:
        local = Path(wd) / job.pipeline
    if not local.is_file():
        raise ConfigError(f"{job.path}: pipeline: expected a pipeline file, {local} does not exist")
    try:
        validate_pipeline_file(local)
    except ConfigError as exc:
        raise ConfigError(f"{job.path}: pipeline: {exc}") from None
