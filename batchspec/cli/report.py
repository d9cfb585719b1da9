"""`batchspec report`: print what a run did (a rich table per shard, totals at the bottom), or its
JSON, and optionally write the HTML page with plots. The numbers live in batchspec.report."""

from __future__ import annotations

import json
import sys

import click


@click.command("report")
@click.argument("output")
@click.option("--html", "html_path", envvar="BATCHSPEC_REPORT_HTML", metavar="FILE",
              help="Also write a self-contained HTML page with plots (acceptance, speedup, calibrated arms, time split).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON instead of a table.")
@click.option("--gpu-hour-price", type=click.FloatRange(min=0, min_open=True), envvar="BATCHSPEC_GPU_HOUR_PRICE", metavar="P",
              help="Price of one GPU-hour (CPU-hour on CPU workers): adds the cost per million output tokens and the money saved.")
def command(output: str, html_path: str | None, as_json: bool, gpu_hour_price: float | None) -> None:
    """Report on the run in OUTPUT (a path or fsspec URL): per shard its key, rows, errors, the
    method and draft length chosen, acceptance rate, mean accepted length, tokens/s, speedup
    over its calibrated baseline and the share of time spent calibrating; totals at the bottom.
    Then what speculation saved, per shard key and for the run: GPU-hours used (CPU-hours on CPU
    workers), what plain decoding would have taken for the same rows, the hours saved with their
    uncertainty (the workers' cost tables' intervals) and output tokens per GPU-hour; with
    --gpu-hour-price, the cost per million output tokens and the money saved.

    For s3:// the credentials, region and endpoint come from AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION and AWS_ENDPOINT_URL.

    \b
    Examples:
      batchspec report out
      batchspec report out --html report.html
      batchspec report out --gpu-hour-price 2.5
      batchspec report s3://my-bucket/batchspec/nightly/$(date -u +%F) --json | jq .totals
      AWS_ENDPOINT_URL=http://minio:9000 batchspec report s3://runs/nightly --html r.html
    """
    from batchspec.report import load_report, render_html

    report = load_report(output, gpu_hour_price=gpu_hour_price)
    if html_path:
        _write_html(html_path, render_html(report))
    if as_json:
        click.echo(json.dumps(report.to_doc(), indent=1, default=str))
    else:
        _print_table(report)
    if html_path:
        click.echo(f"wrote {html_path}", err=True)


def _write_html(path: str, page: str) -> None:
    import fsspec

    from batchspec.errors import OutputError, one_line

    try:
        with fsspec.open(path, "w", encoding="utf-8") as f:
            f.write(page)
    except Exception as exc:
        raise OutputError(f"--html {path}: cannot write: {one_line(exc)}") from exc


def _print_table(report) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from batchspec.report import event_rows, table_rows

    # Every string from the run (OUTPUT, keys, ids, reasons) goes in as Text: data is never markup.
    header, rows, total = table_rows(report)
    title = Text(f"batchspec report: {report.output}")
    caption = Text(" · ".join(str(x) for x in (report.engine, report.model, "complete" if report.complete else "NOT finished") if x))
    table = Table(title=title, caption=caption, show_footer=True)
    for i, (name, foot) in enumerate(zip(header, total)):
        table.add_column(name, footer=Text(foot), justify="left" if i in (0, 1, 4) else "right", no_wrap=i == 0)
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    console = Console(width=None if sys.stdout.isatty() else 180)  # piped: wide enough for every column
    console.print(table)
    events = event_rows(report)
    if events:
        console.print("calibration events (shard, rows finished, event, arm, predicted, measured, why):")
        for e in events:
            console.print(Text("  " + "  ".join(x for x in e if x and x != "-")), highlight=False)
    _print_savings(console, report.savings)
    for warning in report.warnings:
        console.print(Text.assemble(("warning:", "yellow"), f" {warning}"))


def _print_savings(console, savings) -> None:
    from rich.table import Table
    from rich.text import Text

    from batchspec.report.savings import header, notes, row

    if savings is None or not savings.run.shards:
        return
    head = header(savings)
    table = Table(title=Text(f"what speculation saved, in {savings.unit}-hours"), show_footer=True)
    total = row(savings.run, savings)
    for i, (name, foot) in enumerate(zip(head, total)):
        table.add_column(name, footer=Text(foot), justify="left" if i == 0 else "right")
    for hours in savings.keys:
        table.add_row(*(Text(cell) for cell in row(hours, savings)))
    console.print(table)
    for line in notes(savings):
        console.print(Text("  " + line), highlight=False)
