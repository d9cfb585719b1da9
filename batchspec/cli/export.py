"""`batchspec export`: a committed run's outputs in another format (batchspec.export)."""

from __future__ import annotations

import click


@click.command("export")
@click.argument("output")
@click.argument("dest")
@click.option("--format", "fmt", type=click.Choice(["batch-api"]), default="batch-api", show_default=True,
              help="batch-api: one Batch API result line per request line of a .jsonl INPUT, in input order.")
def command(output: str, dest: str, fmt: str) -> None:
    """Write the finished run in OUTPUT to DEST (paths or fsspec URLs) as a Batch API result file:
    for each request line of the run's INPUT, in order, one line with its custom_id and either a
    response (status_code 200, a chat.completion or text_completion body with usage) or an error
    (code and message). OUTPUT's Parquet outputs stay the record; an unfinished run is refused.

    \b
    Examples:
      batchspec run requests.jsonl out
      batchspec export out results.jsonl --format batch-api
      batchspec export s3://bucket/runs/nightly s3://bucket/results/nightly.jsonl
    """
    from batchspec.export import export_batch_api

    done = export_batch_api(output, dest)
    click.echo(f"wrote {done.lines} result line(s), {done.errors} with an error, to {done.path}")
