"""The batchspec job file (jobs/*.yaml, `kind: batchspec-job`): what `batchspec submit` runs on a
Ray cluster (docs/deploy.md). Paths: `runtime_env.working_dir` is relative to the job file;
`pipeline` and `input` to that working directory (the job runs in an uploaded copy of it); `output`
must be absolute or a URL, since a relative one would land in Ray's session folder and vanish."""

from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import AliasChoices, BeforeValidator, Field, StrictStr, confloat, conint, constr, create_model

from batchspec.config.kit import Expect, Section, check, nullable, number, read_yaml, said, text
from batchspec.config.run import FIELDS, RunConfig, _date, field_type, validate_pipeline_file
from batchspec.errors import ConfigError
from batchspec.redact import redact_text
from batchspec.write import resolve_template

JOB_KIND = "batchspec-job"
NOT_OPTIONS = ("device", "ray_address", "ray_num_cpus", "calibration", "storage_options", "llm_options",
               "strict_speculation", "train_head_budget")  # pipeline-file only
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,46}[a-z0-9])?$")
STRINGS = Annotated[Optional[dict[Any, Annotated[StrictStr, Expect('a string (quote numbers: "1")')]]], Expect("a mapping of names to strings")]
LIST = Annotated[list[StrictStr], Expect("a list of strings")]


def run_options() -> tuple[str, ...]:
    """The `batchspec run` options a job may set, by Python name: the pipeline fields the command
    line exposes (the CLI's own options are checked against this list in tests)."""
    return tuple(name for name in FIELDS if name not in NOT_OPTIONS)


class _Options(Section):
    what = "a mapping of batchspec run options"

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return (*cls.model_fields, *(name.replace("_", "-") for name in cls.model_fields))

    @classmethod
    def unknown(cls, key: Any) -> Any:
        return said(f"unknown option; expected one of {', '.join(sorted(cls.model_fields))}", key)


RunOptions = create_model("RunOptions", __base__=_Options, __doc__="`batchspec run` options, by their long name (either spelling).", **{
    name: (Annotated[dt.date, BeforeValidator(_date), Expect("a date YYYY-MM-DD")] if name == "run_date" else field_type(RunConfig, name),
           Field(None, description=RunConfig.__pydantic_fields__[name].description,
                 validation_alias=AliasChoices(name, name.replace("_", "-"))))
    for name in run_options()})


class Resources(Section):
    """The driver's resources (Ray Jobs API entrypoint_*); the workers': the pipeline's `worker:`."""

    what = None

    entrypoint_num_cpus: nullable(number(ge=0)) = Field(None, description="CPUs of the driver.")
    entrypoint_num_gpus: nullable(number(ge=0)) = Field(None, description="GPUs of the driver.")
    entrypoint_memory: Annotated[Optional[conint(strict=True, ge=0)], Expect("bytes as an integer >= 0")] = Field(None, description="Memory of the driver, in bytes.")
    entrypoint_resources: Annotated[Optional[dict[Any, confloat(strict=True, ge=0)]], Expect("a mapping of resource name to a number >= 0")] = Field(
        None, description="Custom Ray resources of the driver.")


class RuntimeEnv(Section):
    """Ray's runtime_env for the job; `${NAME}` in an env_vars value is read from the submitter's
    environment at submit time, so credentials stay out of the file."""

    working_dir: nullable(text("a folder or a URI")) = Field(None, description="Uploaded and made the job's working directory; relative to the job file.")
    py_modules: LIST = Field(None, description="Python modules to upload.")
    pip: Annotated[Union[list[StrictStr], StrictStr, dict, None], Expect("a list of requirements, a requirements file or a mapping")] = Field(None, description="pip packages to install.")
    uv: Any = Field(None, description="uv packages to install.")
    conda: Any = Field(None, description="A conda environment.")
    env_vars: STRINGS = Field(None, description="Environment variables of the job; ${NAME} reads the submitter's.")
    excludes: LIST = Field(None, description="Files of working_dir not to upload (gitignore patterns).")
    image_uri: Any = Field(None, description="A container image to run the job in.")
    config: Any = Field(None, description="Ray's runtime_env config (setup timeout, eager install).")


class JobFile(Section):
    """A batchspec job file (jobs/*.yaml): what `batchspec submit` runs on a Ray cluster."""

    missing = "None"

    kind: Annotated[Literal[JOB_KIND], Expect(repr(JOB_KIND))] = Field(description="How `batchspec validate` recognises a job file.")
    name: Annotated[constr(strict=True, pattern=_NAME.pattern), Expect("lowercase letters, digits and '-' (at most 48)")] = Field(
        description="Names the Ray submission id.")
    address: text("a string", null=True) = Field(None, description="The Ray Jobs API; --address, BATCHSPEC_ADDRESS and RAY_ADDRESS win.")
    pipeline: text("a string", null=True) = Field(None, description="The pipeline file, as seen from the job's working directory; null: the default.")
    input: text("a path or URL") = Field(description="INPUT, as seen from the job's working directory.")
    output: text("a path or URL") = Field(description="OUTPUT: absolute or a URL ({date} {yyyy} {mm} {dd}: the run date).")
    options: Optional[RunOptions] = Field(None, description="Any `batchspec run` option, by its long name.")
    resources: Optional[Resources] = Field(None, description="For the driver only.")
    runtime_env: Optional[RuntimeEnv] = Field(None, description="Ray's runtime_env.")
    metadata: STRINGS = Field(None, description="Strings shown by `ray job list`.")


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
    unknown = next((k for k in data if k not in JobFile.model_fields), None)
    if unknown is not None:
        raise ConfigError(f"{path}: unknown key {unknown!r}; expected one of {', '.join(JobFile.model_fields)}")
    job = check(JobFile, data, path)
    for key, value in (("input", job.input), ("output", job.output), ("options.prior_run", (job.options and job.options.prior_run))):
        if value is not None:
            _check_template(path, key, value)
            if key != "input":  # the OUTPUT of a run: absolute, or it lands in Ray's session folder and vanishes with it
                _check_absolute(path, key, value)
    options = {str(k).replace("-", "_"): v for k, v in (data.get("options") or {}).items()}
    if "run_date" in options:
        options["run_date"] = job.options.run_date.isoformat()
    spec = JobSpec(path=path, name=job.name, input=job.input, output=job.output, pipeline=job.pipeline, address=job.address,
                   options=options, resources={k: v for k, v in (data.get("resources") or {}).items() if v is not None},
                   runtime_env=_runtime_env(path, data.get("runtime_env") or {}), metadata={str(k): v for k, v in (job.metadata or {}).items()})
    _check_pipeline(spec)
    return spec


def _check_template(path: str, key: str, value: str) -> None:
    try:
        resolve_template(value, dt.date(2000, 1, 1))
    except ConfigError:
        raise ConfigError(f"{path}: {key}: unknown template field in {value!r}; expected {{date}}, {{yyyy}}, {{mm}} or {{dd}}") from None


def _check_absolute(path: str, key: str, value: str) -> None:
    if "://" not in value and not os.path.isabs(value):
        raise ConfigError(f"{path}: {key}: expected an absolute path or a URL (the job runs in a copy of working_dir), got {value!r}")


def _runtime_env(path: str, value: dict) -> dict[str, Any]:
    """The runtime_env to send: working_dir resolved from the job file's folder, env_vars as strings."""
    out = dict(value)
    wd = value.get("working_dir")
    if wd is not None:
        if "://" in path and "://" not in wd and not os.path.isabs(wd):
            raise ConfigError(f"{path}: runtime_env.working_dir: expected a URI or an absolute folder for a job file at a URL, got {wd!r}")
        if "://" not in wd:
            local = (Path(path).resolve().parent / wd).resolve()
            if not local.is_dir():
                raise ConfigError(f"{path}: runtime_env.working_dir: expected a folder (relative to the job file), {local} is not one")
            out["working_dir"] = str(local)
    if "env_vars" in value:
        out["env_vars"] = {str(k): v for k, v in (value["env_vars"] or {}).items()}
    return out


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
