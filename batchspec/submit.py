"""`batchspec submit`: the same run as `batchspec run`, as a Ray job through the Ray Jobs API.

This module owns the entrypoint a job file becomes and the conversation with the cluster's Jobs API (submit, attach, tail logs, final status). It
knows nothing about what the run does: the entrypoint is `python -m batchspec run INPUT OUTPUT
--pipeline ...` and the pipeline does the rest on the cluster.

The job file itself is read and validated by batchspec/config/job.py.

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
from dataclasses import dataclass
from typing import Any, Callable

from batchspec.config.job import JobSpec
from batchspec.errors import ConfigError, one_line
from batchspec.redact import MASK, redact, redact_strings, redact_text

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
# Ray's Jobs API answers 500 "No available agent to submit job, please try again later." while the
# head's job agent is not up yet (ray/dashboard/modules/job/job_head.py, submit_job): a head that
# has just started, or a loaded one. batchspec tries again for this long before giving up.
AGENT_WAIT_S = 60.0
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


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
# The entrypoint


def entrypoint(job: JobSpec, run_date: dt.date) -> str:
    """`python -m batchspec run INPUT OUTPUT --pipeline P <options> --run-date D`, shell-quoted."""
    argv = ["python", "-m", "batchspec", "run", job.input, job.output]
    if job.pipeline:
        argv += ["--pipeline", job.pipeline]
    for name, value in job.options.items():
        if name == "run_date":
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):  # --resume / --no-resume
            argv.append(flag if value else "--no-" + flag[2:])
        else:
            argv += [flag, str(value)]
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
        raise ConfigError(f"--address {address}: cannot reach the Ray Jobs API: {one_line(exc)}{_auth_hint(exc)}") from None


@dataclass(frozen=True)
class SubmitPlan:
    """Everything sent to the Jobs API, decided before contacting it (what --dry-run prints)."""

    base_id: str  # batchspec-<name>-<date>; a rerun after it ended gets -r2, -r3, ...
    entrypoint: str
    output: str  # OUTPUT with the date filled in
    runtime_env: dict[str, Any]
    resources: dict[str, Any]
    metadata: dict[str, str]
    from_environment: tuple[str, ...] = ()  # env_vars whose value was filled from the submitter's ${NAME}

    def shown(self) -> dict[str, Any]:
        """As a document to print: env vars filled from the submitter's environment or named like a
        secret masked, and every URL (the entrypoint's INPUT and OUTPUT, a pip index, metadata)
        without its user info or signed query (batchspec.redact)."""
        env = dict(self.runtime_env)
        if "env_vars" in env:
            env["env_vars"] = {k: MASK if k in self.from_environment else v for k, v in env["env_vars"].items()}
        doc = {**dataclasses.asdict(self), "runtime_env": redact(env), "metadata": redact(self.metadata)}
        doc.pop("from_environment")
        return redact_strings(doc)


def plan_submission(job: JobSpec, run_date: dt.date, environ: dict[str, str] | None = None) -> SubmitPlan:
    from batchspec.write import resolve_template

    output = resolve_template(job.output, run_date)
    return SubmitPlan(
        base_id=f"batchspec-{job.name}-{run_date.isoformat()}", entrypoint=entrypoint(job, run_date), output=output,
        runtime_env=resolve_env(job, environ), resources=dict(job.resources),
        metadata={"batchspec_job": job.name, "run_date": run_date.isoformat(), "output": redact_text(output), **job.metadata},
        from_environment=tuple(k for k, v in job.runtime_env.get("env_vars", {}).items() if _ENV_REF.search(v)),
    )


def submit(job: JobSpec, address: str, plan: SubmitPlan) -> Submission:
    """Submit the planned job (or attach to the same job and date if it is still running)."""
    client = connect(address)
    job_id, attached = _free_id(client, plan.base_id)
    if attached:
        return Submission(job_id, address, plan.entrypoint, plan.output, attached=True)
    deadline, pause = time.monotonic() + AGENT_WAIT_S, 0.5
    while True:
        try:
            client.submit_job(entrypoint=plan.entrypoint, submission_id=job_id, runtime_env=plan.runtime_env or None,
                              metadata=plan.metadata, **plan.resources)
            return Submission(job_id, address, plan.entrypoint, plan.output, attached=False)
        except Exception as exc:
            if "try again later" in str(exc) and time.monotonic() + pause < deadline:
                time.sleep(pause)
                pause = min(pause * 2, 8.0)
                continue
            raise ConfigError(f"{job.path}: the Ray Jobs API at {address} refused the job: {one_line(exc)}{_auth_hint(exc)}") from None


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
    message = None
    if status != "SUCCEEDED":
        try:
            message = failure_line(client.get_job_logs(job_id))
        except Exception:  # the logs are a better message when there are any; never a new failure
            message = None
        # Ray's own message ends with the last lines of the log: the fallback when reading failed.
        message = message or failure_line(info.message or "")
    return JobOutcome(job_id, status, message or one_line(info.message or ""))


_NO_MODULE = re.compile(r"No module named '?([A-Za-z_][A-Za-z0-9_.]*)'?")
_NO_PYTHON = re.compile(r"\bpython: (command )?not found")
ENV_HINT = ("start the head from the venv (make ray-head: the job runs the head's PATH python), "
            "or give the job file runtime_env pip")


def failure_line(logs: str) -> str | None:
    """Why a job failed, in one line, from its logs: the `Error: ...` line batchspec printed, or,
    when batchspec never started, that the job's python lacks it (the head's PATH python is not
    the venv's). None when the logs say neither."""
    errors = [line for line in logs.splitlines() if line.startswith("Error: ")]
    if errors:
        return one_line(errors[-1][len("Error: "):])
    if _NO_PYTHON.search(logs):
        return f"the job found no python on the head's PATH; {ENV_HINT}"
    missing = _NO_MODULE.search(logs)
    if missing:
        module = missing.group(1).split(".")[0]
        what = "batchspec" if module == "batchspec" else f"batchspec's dependency {module!r}"
        return f"the job's python lacks {what} (No module named {module!r}); {ENV_HINT}"
    return None


def _auth_hint(exc: BaseException) -> str:
    if "uthenticat" in str(exc):
        return " (the cluster wants a token: set RAY_AUTH_MODE=token to read ~/.ray/auth_token)"
    return ""

