"""`batchspec validate`: check pipeline, trt_configs, candidates and job files and Kubernetes
manifests, one line per file; exit 1 when any is invalid."""

from __future__ import annotations

import click


@click.command("validate")
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
def command(files: tuple[str, ...]) -> None:
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
    """
    from batchspec.config.validate import validate_files
    from batchspec.redact import redact_text

    results = validate_files(list(files))
    for r in results:
        click.echo(redact_text(r.line), err=not r.ok)
    bad = [r for r in results if not r.ok]
    if bad:
        raise click.ClickException(f"{len(bad)} of {len(results)} file(s) invalid")
