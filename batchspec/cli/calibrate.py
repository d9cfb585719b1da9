"""`batchspec calibrate`: the calibration table for a sample of INPUT, per shard key, no outputs."""

from __future__ import annotations

import json
import sys

import click

from batchspec.cli.options import model_and_spec_options, sampling_options
from batchspec.config.run import build_config


@click.command("calibrate")
@click.argument("input")
@model_and_spec_options
@sampling_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def command(input: str, pipeline: str | None, as_json: bool, **options) -> None:
    """Measure every calibration arm on a sample of INPUT, per shard key, and show the choice.

    Runs the same calibration a `batchspec run` shard would (interleaved arms at the production
    batch size, draft length predicted then confirmed, the margin rule) in this process, on the
    first --shard-size rows of each key, and writes nothing.

    \b
    Examples:
      batchspec calibrate examples/prompts.parquet --shard-by task
      batchspec calibrate prompts.parquet --model qwen2.5-coder-1.5b --draft-model qwen2.5-coder-0.5b --dtype bfloat16
      batchspec calibrate prompts.parquet --spec trt_configs/ngram.yaml --json
    """
    from batchspec.pipeline import calibrate_only

    config = build_config(input, "", pipeline, **options)
    results = calibrate_only(config)
    if as_json:
        click.echo(json.dumps([r.to_doc() for r in results], indent=2))
    else:
        _print_tables(results)


def _print_tables(results) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=sys.stdout, width=max(100, Console().width))
    for r in results:
        d = r.decision
        table = Table(title=f"shard key {r.shard_key!r}: {r.rows} rows, sample of {r.sampled}", title_justify="left")
        for col in ("arm", "tokens/s", "predicted", "acceptance", "mean acc. len", "predicted vs none", "measured vs none", "choice"):
            table.add_column(col, justify="left" if col in ("arm", "choice") else "right")
        base = d.baseline_tokens_per_s
        for a in d.arms:
            ratio = a.vs_none(base)
            speed = f"{ratio:.2f}x" if ratio is not None else ""
            table.add_row(
                a.label,
                f"{a.tokens_per_s:.1f}" if a.tokens_per_s else ("error" if a.error else "-"),
                f"{a.predicted_tokens_per_s:.1f}" if a.predicted_tokens_per_s else "",
                f"{a.acceptance_rate:.2f}" if a.acceptance_rate is not None else "",
                f"{a.mean_accepted_len:.2f}" if a.mean_accepted_len else "",
                f"{a.predicted_speedup:.2f}x" if a.predicted_speedup else "",
                speed,
                "<- chosen" if a is d.chosen_arm else "",
            )
        console.print(table)
        console.print(f"choice: {d.chosen.label} ({d.reason}); calibration {d.calibration_s:.1f} s, "
                      f"{d.overhead_s:.1f} s of it not kept as output\n")
