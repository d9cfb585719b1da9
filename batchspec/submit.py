"""`batchspec submit`: the same run as `batchspec run`, as a Ray job through the Ray Jobs API.

This module owns the batchspec job file (jobs/*.yaml), its validation, the entrypoint it becomes,
and the conversation with the cluster's Jobs API (submit, attach, tail logs, final status). It
knows nothing about what the run does: the entrypoint is `python -m batchspec run INPUT OUTPUT
--pipeline ...` and the pipeline does the rest on the cluster.

A job file:

    kind: batchspec-job            # required: how `batchspec validate` recognises it
    name: nightly-trtllm           # lowercase letters, digits, '-'; names the Ray submission id
    address: null                  # optional; --address, BATCHSPEC_ADDRESS and RAY_ADDRESS win
    pipeline: pipelines/gpu_trtllm.yaml   # as seen from the job's working directory
    input: s3://bucket/prompts/
    output: s3://bucket/runs/{date}       # {date} {yyyy} {mm} {dd}: batchspec.write templates
    options: {shard_by: task}      # any `batchspec run` option, by its long name
    resources: {entrypoint_num_cpus: 1, entrypoint_num_gpus: 0, entrypoint_memory: null,
                entrypoint_resources: {}}   # for the driver only; workers: the pipeline's worker:
    runtime_env: {working_dir: .., excludes: [...], pip: [...], env_vars: {K: "v" | "${K}"}}
    metadata: {team: data}         # optional strings, shown by `ray job list`

Paths: `runtime_env.working_dir` is relative to the job file; `pipeline` and `input` are relative
to that working directory (the job runs in an uploaded copy of it). `output` must be absolute or
a URL, since a relative one would land inside Ray's session folder and vanish with it.
`${NAME}` in an env_vars value is read from the submitter's environment at submit time, so
credentials stay out of the file.

Dates: the run date is fixed when the job is submitted (today in UTC, or --run-date) and passed
to `batchspec run --run-date`, so a job that queues past midnight still writes the night it was
meant for. The Ray submission id is `batchspec-<name>-<date>`: submitting the same job for the
same date while that job is still running attaches to it instead of starting a second driver,
and after it ended starts `...-r2`, `...-r3`, whose run resumes the committed shards of OUTPUT.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import os
import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from batchspec.errors import ConfigError

JOB_KIND = "batchspec-job"
KEYS = ("kind", "name", "address", "pipeline", "input", "output", "options", "resources", "runtime_env", "metadata")
RESOURCE_KEYS = ("entrypoint_num_cpus", "entrypoint_num_gpus", "entrypoint_memory", "entrypoint_resources")
RUNTIME_ENV_KEYS = ("working_dir", "py_modules", "pip", "uv", "conda", "env_vars", "excludes", "image_uri", "config")
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,46}[a-z0-9])?$")
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


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
        return f"{self.path}: batchspec job {self.name}, {self.input} -> {self.output}, pipeline {self.pipeline or 'default'}, working_dir {where}"


@dataclass(frozen=True)
class Submission:
    job_id: str
    address: str
    entrypoint: str
    output: str  # OUTPUT with the date filled in
    attached: bool  # True: the same job and date was already running; nothing new was started


@dataclass(frozen=True)
class JobOutcome:
    job_id: str
    status: str  # SUCCEEDED | FAILED | STOPPED
    message: str

    @property
    def ok(self) -> bool:
        return self.status == "SUCCEEDED"


# ---------------------------------------------------------------------------------------------
# The job file


def is_job_doc(data: Any) -> bool:
    return isinstance(data, dict) and data.get("kind") == JOB_KIND


def load_job(path: str | os.PathLike) -> JobSpec:
    """Read and validate a job file once; ConfigError names the file, the key and the expectation."""
    from batchspec.spec_config import read_yaml

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
    if "://" not in data["output"] and not os.path.isabs(data["output"]):
        raise ConfigError(f"{path}: output: expected an absolute path or a URL (the job runs in a copy of working_dir), got {data['output']!r}")
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
    _check_pipeline(job)
    return job


def _check_template(path: str, key: str, value: str) -> None:
    from batchspec.write import resolve_template

    try:
        resolve_template(value, dt.date(2000, 1, 1))
    except ConfigError:
        raise ConfigError(f"{path}: {key}: unknown template field in {value!r}; expected {{date}}, {{yyyy}}, {{mm}} or {{dd}}") from None


def run_options() -> dict[str, Any]:
    """`batchspec run`'s options by Python name (the click parameters themselves), minus pipeline."""
    import click

    from batchspec.cli.run import command

    return {p.name: p for p in command.params if isinstance(p, click.Option) and p.name != "pipeline"}


def _options(path: str, value: Any) -> dict[str, Any]:
    from batchspec.pipeline_config import FIELDS

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
    from batchspec.pipeline_config import validate_pipeline_file

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


# ---------------------------------------------------------------------------------------------
# The entrypoint


def entrypoint(job: JobSpec, run_date: dt.date) -> str:
    """`python -m batchspec run INPUT OUTPUT --pipeline P <options> --run-date D`, shell-quoted."""
    params = run_options()
    argv = ["python", "-m", "batchspec", "run", job.input, job.output]
    if job.pipeline:
        argv += ["--pipeline", job.pipeline]
    for name, value in job.options.items():
        if name == "run_date":
            continue
        param = params[name]
        if param.is_flag:
            argv.append(param.opts[0] if value else param.secondary_opts[0])
        else:
            argv += [param.opts[0], str(value)]
    argv += ["--run-date", run_date.isoformat()]
    return shlex.join(argv)


def job_run_date(job: JobSpec, override: dt.date | None = None) -> dt.date:
    if override is not None:
        return override
    if "run_date" in job.options:
        return dt.date.fromisoformat(job.options["run_date"])
    return dt.datetime.now(dt.timezone.utc).date()


def resolve_env(job: JobSpec, environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The runtime_env to send: `${NAME}` in env_vars filled from the submitter's environment."""
    environ = os.environ if environ is None else environ
    env = dict(job.runtime_env)
    if "env_vars" in env:
        filled = {}
        for key, value in env["env_vars"].items():
            def fill(m: re.Match, key=key) -> str:
                if m.group(1) not in environ:
                    raise ConfigError(f"{job.path}: runtime_env.env_vars.{key}: ${{{m.group(1)}}} is not set in the submitting environment")
                return environ[m.group(1)]

            filled[key] = _ENV_REF.sub(fill, value)
        env["env_vars"] = filled
    return env


def resolve_address(cli_address: str | None, job: JobSpec, environ: dict[str, str] | None = None) -> str:
    """--address > BATCHSPEC_ADDRESS > RAY_ADDRESS > the job file > the local head's dashboard."""
    environ = os.environ if environ is None else environ
    for value in (cli_address, environ.get("BATCHSPEC_ADDRESS"), environ.get("RAY_ADDRESS"), job.address):
        if value:
            return value
    return "http://127.0.0.1:8265"


# ---------------------------------------------------------------------------------------------
# The cluster


def connect(address: str):
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(address)
    except Exception as exc:  # ConnectionError, ValueError, RuntimeError: all one line for the user
        raise ConfigError(f"--address {address}: cannot reach the Ray Jobs API: {_one_line(exc)}{_auth_hint(exc)}") from None


@dataclass(frozen=True)
class SubmitPlan:
    """Everything sent to the Jobs API, decided before contacting it (what --dry-run prints)."""

    base_id: str  # batchspec-<name>-<date>; a rerun after it ended gets -r2, -r3, ...
    entrypoint: str
    output: str  # OUTPUT with the date filled in
    runtime_env: dict[str, Any]
    resources: dict[str, Any]
    metadata: dict[str, str]

    def shown(self) -> dict[str, Any]:
        """As a document, with the values of secret-looking env vars masked."""
        env = dict(self.runtime_env)
        if "env_vars" in env:
            env["env_vars"] = {k: "***" if _secret(k) else v for k, v in env["env_vars"].items()}
        return {**dataclasses.asdict(self), "runtime_env": env}


def plan_submission(job: JobSpec, run_date: dt.date, environ: dict[str, str] | None = None) -> SubmitPlan:
    from batchspec.write import resolve_template

    output = resolve_template(job.output, run_date)
    return SubmitPlan(
        base_id=f"batchspec-{job.name}-{run_date.isoformat()}", entrypoint=entrypoint(job, run_date), output=output,
        runtime_env=resolve_env(job, environ), resources=dict(job.resources),
        metadata={"batchspec_job": job.name, "run_date": run_date.isoformat(), "output": output, **job.metadata},
    )


def submit(job: JobSpec, address: str, plan: SubmitPlan) -> Submission:
    """Submit the planned job (or attach to the same job and date if it is still running)."""
    client = connect(address)
    job_id, attached = _free_id(client, plan.base_id)
    if attached:
        return Submission(job_id, address, plan.entrypoint, plan.output, attached=True)
    try:
        client.submit_job(entrypoint=plan.entrypoint, submission_id=job_id, runtime_env=plan.runtime_env or None,
                          metadata=plan.metadata, **plan.resources)
    except Exception as exc:
        raise ConfigError(f"{job.path}: the Ray Jobs API at {address} refused the job: {_one_line(exc)}{_auth_hint(exc)}") from None
    return Submission(job_id, address, plan.entrypoint, plan.output, attached=False)


def _secret(name: str) -> bool:
    return any(word in name.upper() for word in ("SECRET", "KEY", "TOKEN", "PASSWORD", "CREDENTIAL"))


def _free_id(client, base: str) -> tuple[str, bool]:
    """The first of base, base-r2, base-r3, ... that is unused, or a running one to attach to."""
    for attempt in range(1, 100):
        job_id = base if attempt == 1 else f"{base}-r{attempt}"
        try:
            status = str(client.get_job_status(job_id)).split(".")[-1]
        except RuntimeError:  # "Job ... does not exist"
            return job_id, False
        if status not in TERMINAL:
            return job_id, True
    raise ConfigError(f"{base}: 99 submissions of this job and date exist already; pass another --run-date")


def wait(address: str, job_id: str, sink: Callable[[str], None]) -> JobOutcome:
    """Stream the job's logs to `sink` until it ends; return its final status and message."""
    client = connect(address)

    async def tail() -> None:
        async for lines in client.tail_job_logs(job_id):
            sink(lines)

    asyncio.run(tail())
    info = client.get_job_info(job_id)
    status = str(info.status).split(".")[-1]
    while status not in TERMINAL:  # the log stream can close a moment before the status settles
        time.sleep(0.5)
        info = client.get_job_info(job_id)
        status = str(info.status).split(".")[-1]
    return JobOutcome(job_id, status, _one_line(info.message or ""))


def _auth_hint(exc: BaseException) -> str:
    if "uthenticat" in str(exc):
        return " (the cluster wants a token: set RAY_AUTH_MODE=token to read ~/.ray/auth_token)"
    return ""


def _one_line(exc: BaseException | str) -> str:
    return " ".join(str(exc).split())[:400] or type(exc).__name__
