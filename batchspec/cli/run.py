"""`batchspec run`: parse options, build the RunConfig, call `batchspec.pipeline.run`, report."""

from __future__ import annotations

import datetime as dt
import sys

import click

from batchspec.cli.options import PRIOR_RUN, model_and_spec_options, sampling_options
from batchspec.config.run import build_config


@click.command("run")
@click.argument("input")
@click.argument("output")
@model_and_spec_options
@click.option("--workers", type=int, envvar="BATCHSPEC_WORKERS", help="Shard workers (Ray actors, one engine each).")
@sampling_options
@click.option("--run-date", help="Date for {date}/{yyyy}/{mm}/{dd} in INPUT/OUTPUT (default today, UTC).")
@click.option("--resume/--no-resume", default=None, help="Skip shards already committed in OUTPUT (default), or start OUTPUT afresh.")
@click.option("--force", is_flag=True, help="With --no-resume: delete the committed shards of a previous run in OUTPUT (refused without it).")
@click.option("--keep-shards/--no-keep-shards", default=None,
              help="Keep OUTPUT/_shards/ (each shard's input rows) after _SUCCESS, for debugging; by default a finished run removes it.")
@PRIOR_RUN
@click.option("--train-head/--no-train-head", default=None,
              help="With --spec auto on the torch engine: train an EAGLE-3 head per shard key on its first shard's rows "
                   "(OUTPUT/heads/); calibration decides whether it pays on the key's later shards. Pipeline key "
                   "train_head_budget: its share of the key's decode time (default 0.05).")
@click.option("--plan-only", is_flag=True, help="Plan and group (OUTPUT/_plan.json, OUTPUT/_shards/), print the shard table, stop; no model is loaded.")
def command(input: str, output: str, pipeline: str | None, run_date: str | None, plan_only: bool, force: bool, **options) -> None:
    """Generate a completion for every row of INPUT into OUTPUT (paths or fsspec URLs).

    INPUT is a Parquet file, folder or glob with a `prompt` or `messages` column; a prompt goes to
    the model as one user message through its chat template (--prompt-format raw: as is, for base
    models). INPUT may instead be Batch API request files (.jsonl: custom_id, method, url, body),
    one row per request line; `batchspec export` writes the run back as a Batch API result file. OUTPUT receives outputs/*.parquet (one row per input row), stats/*.parquet (one row
    per shard), _plan.json, _manifest.json and _SUCCESS. Options override the pipeline file. Exit
    code 0 means every input row has exactly one output row.

    \b
    Examples:
      batchspec run examples/prompts.parquet out --shard-by task
      batchspec run s3://bucket/prompts/ s3://bucket/runs/{date} --workers 4
      batchspec run prompts.parquet out --spec none --max-tokens 32
      batchspec run completions.parquet out --model ./my-base-model --prompt-format raw
      batchspec run s3://bucket/prompts/ s3://bucket/run1 --shard-by task --plan-only
      batchspec run requests.jsonl out --shard-by url

    With --plan-only the run stops after the plan: a scheduler can size the job from the shard
    table and the rows that will fail, and a later run of the same INPUT and OUTPUT without the
    flag resumes from that plan.

    One run writes an OUTPUT at a time (a lease in OUTPUT/_lease/), and an OUTPUT is bound to the
    options its committed shards were made with: a rerun or resume with other options (model,
    sampling, prompt format, spec, ...) is refused. --no-resume starts over; where OUTPUT holds
    committed shards it needs --force, which deletes them.
    """
    from batchspec.pipeline import plan_run, run

    date = _date(run_date)
    config = build_config(input, output, pipeline, run_date=date, **options)
    if force and config.resume:
        raise click.UsageError("--force only goes with --no-resume", ctx=None)
    if plan_only:
        _print_plan(plan_run(config, force=force))
        return
    with _Progress() as progress:
        summary = run(config, progress=progress, force=force)
    _print_summary(summary)
    if not summary.complete:
        raise click.ClickException(f"{summary.rows} output rows for a plan of more rows; rerun to resume")
    if summary.shards_failed:
        raise click.ClickException(f"{summary.shards_failed} of {summary.shards} shard(s) failed every attempt and are written as "
                                   f"error rows (first {summary.failed_reason}); no _SUCCESS; rerun to retry them")
    if summary.speculation_unmeasured:
        line = (f"speculation could not be measured in {summary.speculation_unmeasured} of {summary.shards} shard(s), "
                f"which ran without it (first {summary.speculation_reason})")
        if config.strict_speculation:
            raise click.ClickException(line + "; outputs are complete; strict_speculation: false accepts this")
        click.echo(f"warning: {line}", err=True)


def _date(value: str | None) -> dt.date | None:
    if value is None:
        return None
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"expected YYYY-MM-DD, got {value!r}", param_hint="--run-date") from None


class _Progress:
    """A rich progress bar on stderr over shards, with the running count of output tokens."""

    def __enter__(self):
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.tokens = 0
        self.bar = Progress(
            TextColumn("shards"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[tokens]} tokens"),
            TimeElapsedColumn(), console=Console(file=sys.stderr), transient=False,
        )
        self.bar.__enter__()
        self.task = None
        return self

    def planned(self, shards: int, rows: int, skipped: int) -> None:
        self.task = self.bar.add_task("shards", total=shards, completed=skipped, tokens=0)
        if skipped:
            self.bar.console.print(f"resuming: {skipped} of {shards} shards already committed")

    def shard_done(self, outcome) -> None:
        self.tokens += outcome.output_tokens
        self.bar.update(self.task, advance=1, tokens=self.tokens)

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)


def _print_plan(planned) -> None:
    """The shard table on stdout: one line per shard, then a total, then the rows that will fail."""
    plan, rows = planned.plan, planned.rows
    click.echo(f"{'shard_id':<24} {'shard_key':<24} {'rows':>8}")
    for s in plan.shards:
        key = "" if s.shard_key is None else s.shard_key
        click.echo(f"{s.shard_id:<24} {key:<24} {s.rows:>8}")
    keys = len({s.shard_key for s in plan.shards})
    click.echo(f"{plan.rows} rows, {len(plan.shards)} shards, {keys} shard key(s), plan {plan.fingerprint}")
    if rows.failing:
        click.echo(f"{rows.failing} of {rows.rows} rows will fail (first {rows.first})")


def _print_summary(s) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from batchspec.redact import redact_text

    table = Table(title=Text(f"batchspec run -> {redact_text(s.output)}"), show_header=False)
    speedup = f"{s.speedup:.2f}x" if s.speedup else "n/a"
    if s.speedup and s.speedup_predicted_share:
        speedup += f" ({s.speedup_predicted_share:.0%} of decode time predicted, not measured)"
    decode = f"{s.decode_tokens_per_s:.1f}" if s.decode_tokens_per_s else "n/a"
    base = f"{s.baseline_tokens_per_s:.1f}" if s.baseline_tokens_per_s else "n/a"
    for name, value in [
        ("rows", f"{s.rows} ({s.error_rows} errors)"),
        ("shards", f"{s.shards} ({s.shards_skipped} resumed, {s.shards_failed} failed, {s.retries} retries)"),
        ("output tokens", str(s.output_tokens)),
        ("tokens/s, end to end", f"{s.tokens_per_s:.1f} (output tokens / wall)"),
        ("decode tokens/s", f"{decode} (decode tokens / decode s)"),
        ("plain decoding tokens/s", f"{base} (priced for the same tokens)"),
        ("speedup vs plain decoding", speedup),
        ("wall", f"{s.wall_s:.1f} s"),
        *([("prior run", s.prior_run)] if s.prior_run else []),
        *([("engine builds", f"{s.builds} ({s.build_s:.0f} s, {s.build_s / s.wall_s:.0%} of wall)")] if s.builds and s.wall_s else []),
        *([("speculation", f"NOT MEASURED in {s.speculation_unmeasured} shard(s): {s.speculation_reason}")] if s.speculation_unmeasured else []),
    ]:
        table.add_row(name, Text(value))  # data (an OUTPUT path, a shard key) is never rich markup
    Console(file=sys.stderr).print(table)
    for line in s.dropped_arms:  # one unwrapped line each, for logs and grep
        click.echo(f"warning: arm left out of calibration: {line}", err=True)
    versus = f"decode {decode} tokens/s vs plain {base}: {speedup}" if s.speedup else f"speedup {speedup}"
    click.echo(f"{s.rows} rows ({s.error_rows} errors), {s.shards} shards, {s.tokens_per_s:.1f} tokens/s end to end, "
               f"{versus} -> {redact_text(s.output)}")
    if s.empty_text_warning:  # one line under the summary: the first thing a broken-looking run needs
        click.echo(f"warning: {s.empty_text_warning}", err=True)
