"""`batchspec calibrate`: the calibration table for a sample of INPUT, per shard key, no outputs."""

from __future__ import annotations

import json
import sys

import click

from batchspec.cli.options import PRIOR_RUN, model_and_spec_options, sampling_options
from batchspec.config.run import build_config


@click.command("calibrate")
@click.argument("input")
@model_and_spec_options
@sampling_options
@PRIOR_RUN
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def command(input: str, pipeline: str | None, as_json: bool, **options) -> None:
    """Run each shard key's first shard of INPUT under the calibration controller and show every
    arm's estimate; writes nothing.

    Runs what a `batchspec run` shard would (the rows under the controller, counterfactual
    acceptance of every arm from every finished row, step costs learned from the run, the margin
    rule) in this process, on the first --shard-size rows of each key.

    \b
    Examples:
      batchspec calibrate examples/prompts.parquet --shard-by task
      batchspec calibrate prompts.parquet --model qwen2.5-coder-1.5b --draft-model qwen2.5-coder-0.5b --dtype bfloat16
      batchspec calibrate prompts.parquet --spec trt_configs/ngram.yaml --json
    """
    from batchspec.calibrate_keys import calibrate_only

    config = build_config(input, "", pipeline, **options)
    results = calibrate_only(config)
    if as_json:
        click.echo(json.dumps([r.to_doc() for r in results], indent=2))
    else:
        _print_tables(results)


def _print_tables(results) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(file=sys.stdout, width=max(100, Console().width))
    for r in results:
        d = r.decision
        sampled = r.sampled + r.failing_rows
        if d is None:
            click.echo(f"none of the {sampled} sampled rows of key {r.shard_key!r} can run (first {r.first_failure})\n")
            continue
        if r.failing_rows:
            click.echo(f"{r.failing_rows} of the {sampled} sampled rows of key {r.shard_key!r} will fail (first {r.first_failure})")
        table = Table(title=Text(f"shard key {r.shard_key!r}: {r.rows} rows, ran {r.sampled}"), title_justify="left")
        for col in ("arm", "rows run", "measured tok/s", "acceptance", "mean acc. len", "predicted vs none", "choice"):
            table.add_column(col, justify="left" if col in ("arm", "choice") else "right")
        for a in d.arms:
            table.add_row(
                a.label, str(a.rows_run),
                f"{a.tokens_per_s:.1f}" if a.tokens_per_s else "-",
                f"{a.acceptance_rate:.2f}" if a.acceptance_rate is not None else "",
                f"{a.mean_accepted_len:.2f}" if a.mean_accepted_len else "",
                f"{a.predicted_speedup:.2f}x" if a.predicted_speedup else "",
                "<- chosen" if a.label == d.chosen.label else "",
            )
        console.print(table)
        for e in d.events:
            console.print(Text(f"  row {e.row}: {e.kind} {e.arm}" + (f" ({e.reason})" if e.reason else "")))
        console.print(Text(f"choice: {d.chosen.label} ({d.reason}); calibration {d.calibration_s:.1f} s\n"))
