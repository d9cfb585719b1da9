"""The job file's options are exactly the `batchspec run` command-line options (less the
arguments and --pipeline, which the job file has keys of its own for), both derived from one
list: batchspec.config.run.FIELDS."""

from __future__ import annotations

import datetime as dt

import click

from batchspec.cli.run import command as run_command
from batchspec.config.job import JobSpec, run_options
from batchspec.submit import entrypoint


def _cli_options() -> set[str]:
    # --plan-only is a mode of the command (plan, print, stop), not a setting of the run a job runs;
    # --force (delete a previous run's committed shards) is a person's decision, never a scheduled job's
    return {p.name for p in run_command.params if isinstance(p, click.Option)} - {"pipeline", "plan_only", "force"}


def test_every_job_option_is_a_run_option_and_back():
    assert set(run_options()) == _cli_options()


def test_the_entrypoint_of_every_option_parses_as_batchspec_run():
    values = {"engine": "torch", "model": "m", "draft_model": "d", "dtype": "bfloat16", "spec": "none",
              "candidates": "c.yaml", "shard_by": "task", "shard_size": 3, "workers": 2, "batch_size": 4,
              "max_tokens": 5, "temperature": 0.5, "top_p": 0.9, "seed": 7, "resume": False, "run_date": "2026-01-02",
              "keep_shards": True, "prompt_format": "raw", "response_format": "schemas/person.json",
              "prior_run": "s3://bucket/runs/2026-01-01", "train_head": True}
    assert set(values) == set(run_options()), "a new option needs a value here"
    job = JobSpec(path="j.yaml", name="j", input="in", output="/out", options=values)
    argv = entrypoint(job, dt.date(2026, 1, 2)).split()[3:]  # after `python -m batchspec`
    ctx = run_command.make_context("run", argv[1:])
    parsed = {k: v for k, v in ctx.params.items() if k in values}
    assert parsed == {**values, "dtype": "bfloat16", "run_date": "2026-01-02"}
