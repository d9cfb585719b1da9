"""`batchspec validate`: check pipeline, trt_configs, candidates and job files and Kubernetes
manifests, one line per file; exit 1 when any is invalid."""

from __future__ import annotations

import click


@click.command("validate")
@click.argument("files", nargs=-1, metavar="FILE...")
@click.option("--schema", type=click.Choice(["pipeline", "job", "options", "candidates"]),
              help="Write the JSON Schema of a file kind instead (options: a TensorRT-LLM option file).")
def command(files: tuple[str, ...], schema: str | None) -> None:
    """Check each FILE once, recognised by its content: a pipeline (pipelines/*.yaml), a
    TensorRT-LLM option file or a candidates file (trt_configs/), a batchspec job file
    (kind: batchspec-job), or Kubernetes manifests (apiVersion/kind; structure only, nothing is
    sent to a cluster). Prints "OK <file>: <summary>" per good file and one line naming the
    file, key and expectation per bad one; exits 1 if any file is bad.

    \b
    Examples:
      batchspec validate pipelines/*.yaml trt_configs/*.yaml trt_configs/candidates/*.yaml
      batchspec validate jobs/*.yaml
      batchspec validate s3://my-bucket/configs/nightly.yaml
      batchspec validate --schema pipeline > pipeline.schema.json
    """
    import json

    from batchspec.config.validate import json_schema, validate_files
    from batchspec.redact import redact_text

    if schema:
        click.echo(json.dumps(json_schema(schema), indent=2))
        return
    if not files:
        raise click.UsageError("Missing argument 'FILE...'.")
    results = validate_files(list(files))
    for r in results:
        click.echo(redact_text(r.line), err=not r.ok)
    bad = [r for r in results if not r.ok]
    if bad:
        raise click.ClickException(f"{len(bad)} of {len(results)} file(s) invalid")
