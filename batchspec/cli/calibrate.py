"""`batchspec calibrate`: the calibration table for a sample of INPUT, per shard key, no outputs."""

from __future__ import annotations

import json
import sys

import click

from batchspec.pipeline_config import DEFAULT_PIPELINE, build_config


@click.command("calibrate")
@click.argument("input")
@click.option("--pipeline", envvar="BATCHSPEC_PIPELINE", help=f"Pipeline YAML (default {DEFAULT_PIPELINE.name}).")
@click.option("--model", envvar="BATCHSPEC_MODEL", help="Target model: registry name, HF folder or fsspec URL.")
@click.option("--draft-model", envvar="BATCHSPEC_DRAFT_MODEL", help="Draft model for DraftTarget arms.")
@click.option("--engine", type=click.Choice(["torch", "trtllm"]), envvar="BATCHSPEC_ENGINE")
@click.option("--spec", help="auto (the candidates file), or a trt_configs FILE.yaml to measure against none.")
@click.option("--candidates", help="Candidates file that --spec auto calibrates over.")
@click.option("--shard-by", help="Column whose values each get their own calibration (e.g. task).")
@click.option("--shard-size", type=int, help="Rows per key to draw the sample from (default: the pipeline's shard size).")
@click.option("--batch-size", type=int, help="Production batch size to measure at.")
@click.option("--max-tokens", type=int)
@click.option("--temperature", type=float)
@click.option("--top-p", type=float)
@click.option("--seed", type=int)
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]))
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
    from batchspec.calibrate_input import calibrate_input

    config = build_config(input, "", pipeline, **options)
    results = calibrate_input(config)
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
        for col in ("arm", "tokens/s", "predicted", "acceptance", "mean acc. len", "vs none", "choice"):
            table.add_column(col, justify="left" if col in ("arm", "choice") else "right")
        base = d.baseline_tokens_per_s
        for a in d.arms:
            speed = f"{a.tokens_per_s / base:.2f}x" if a.tokens_per_s and base else ""
            table.add_row(
                a.label,
                f"{a.tokens_per_s:.1f}" if a.tokens_per_s else ("error" if a.error else "-"),
                f"{a.predicted_tokens_per_s:.1f}" if a.predicted_tokens_per_s else "",
                f"{a.acceptance_rate:.2f}" if a.acceptance_rate is not None else "",
                f"{a.mean_accepted_len:.2f}" if a.mean_accepted_len else "",
                speed,
                "<- chosen" if a.measured and a.label == d.chosen.label else "",
            )
        console.print(table)
        console.print(f"choice: {d.chosen.label} ({d.reason}); calibration {d.calibration_s:.1f} s\n")
