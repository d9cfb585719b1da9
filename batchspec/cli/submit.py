"""`batchspec submit`: validate a job file, submit it to a Ray cluster, optionally wait for it."""

from __future__ import annotations

import json
import sys

import click

from batchspec.cli.run import _date  # the same --run-date parsing as `batchspec run`


@click.command("submit")
@click.argument("job_file", metavar="JOB.yaml")
@click.option("--address", envvar=["BATCHSPEC_ADDRESS", "RAY_ADDRESS"],
              help="Ray dashboard / Jobs API address, e.g. http://HEAD:8265 (env BATCHSPEC_ADDRESS or RAY_ADDRESS; "
                   "default: the job file's address, else http://127.0.0.1:8265).")
@click.option("--wait", is_flag=True, envvar="BATCHSPEC_WAIT", help="Stream the job's logs and exit with its status (0 SUCCEEDED, 1 otherwise).")
@click.option("--run-date", envvar="BATCHSPEC_RUN_DATE",
              help="The night to run (YYYY-MM-DD) for {date} templates; default today in UTC. Use it to rerun a past night.")
@click.option("--dry-run", is_flag=True, help="Print what would be submitted (entrypoint, runtime_env, resources) as JSON; contact nothing.")
def command(job_file: str, address: str | None, wait: bool, run_date: str | None, dry_run: bool) -> None:
    """Submit JOB.yaml (kind: batchspec-job) as a Ray job running `batchspec run` on a cluster,
    and print the job id.

    The job file names the pipeline, input, output, run options, the driver's resources and the
    runtime environment (see jobs/*.yaml). It is validated before anything is sent. The Ray
    submission id is batchspec-NAME-DATE: submitting the same job for the same date while it
    runs attaches to it; after it ended, the new job resumes the shards OUTPUT already holds.

    \b
    Examples:
      batchspec submit jobs/local.yaml --wait
      batchspec submit jobs/gpu_trtllm.yaml --address http://ray-head:8265
      RAY_ADDRESS=http://ray-head:8265 batchspec submit jobs/gpu_trtllm.yaml --wait --run-date "$(date -u -d yesterday +%F)"
      batchspec submit jobs/gpu_trtllm.yaml --dry-run      # the entrypoint and runtime_env, as JSON
      ray job logs batchspec-nightly-trtllm-$(date -u +%F) --address http://ray-head:8265   # later
    """
    from batchspec import submit
    from batchspec.config.job import load_job
    from batchspec.redact import redact_text

    date = _date(run_date)
    job = load_job(job_file)
    target = submit.resolve_address(address, job)
    plan = submit.plan_submission(job, submit.job_run_date(job, date))
    if dry_run:
        click.echo(json.dumps({"address": redact_text(target), **plan.shown()}, indent=1))
        return
    sub = submit.submit(job, target, plan)
    verb = "attached to running job" if sub.attached else "submitted"
    click.echo(f"{verb} {sub.job_id} at {redact_text(sub.address)} -> {redact_text(sub.output)}", err=True)
    click.echo(sub.job_id)
    if not wait:
        return
    try:
        outcome = submit.wait(target, sub.job_id, lambda lines: (sys.stderr.write(lines), sys.stderr.flush()))
    except KeyboardInterrupt:
        raise click.ClickException(f"stopped waiting; job {sub.job_id} keeps running (ray job stop {sub.job_id} --address {redact_text(target)})") from None
    if not outcome.ok:
        raise click.ClickException(f"job {outcome.job_id} {outcome.status}: {outcome.message or 'no message'}")
    click.echo(f"job {outcome.job_id} SUCCEEDED -> {redact_text(sub.output)}", err=True)

