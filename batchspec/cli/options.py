"""Options shared by the commands that load a model and choose speculative settings (`run`,
`calibrate`), so both spell and document them the same way."""

from __future__ import annotations

import click

from batchspec.config.run import DEFAULT_PIPELINE
from batchspec.engine.base import DTYPES, PROMPT_FORMATS
from batchspec.engine.factory import ENGINES

SHARED = [
    click.option("--pipeline", envvar="BATCHSPEC_PIPELINE",
                 help=f"Pipeline YAML (default {DEFAULT_PIPELINE.name}: local Ray, torch on CPU, SmolLM2)."),
    click.option("--model", envvar="BATCHSPEC_MODEL", help="Target model: registry name, HF folder or fsspec URL."),
    click.option("--draft-model", envvar="BATCHSPEC_DRAFT_MODEL", help="Draft model for Draft_Target arms."),
    click.option("--engine", type=click.Choice(ENGINES), envvar="BATCHSPEC_ENGINE"),
    click.option("--spec", help="auto (calibrate per shard), none, or a trt_configs FILE.yaml."),
    click.option("--candidates", help="Candidates file that --spec auto calibrates over."),
    click.option("--shard-by", help="Column to group rows by before cutting shards (one calibration per value)."),
    click.option("--shard-size", type=int, help="Rows per shard at most."),
]
SAMPLING = [
    click.option("--batch-size", type=int, help="Sequences generated at once per worker."),
    click.option("--max-tokens", type=int, help="Default max new tokens (a max_tokens column overrides per row)."),
    click.option("--temperature", type=float, help="Default temperature; 0 is greedy."),
    click.option("--top-p", type=float),
    click.option("--seed", type=int, help="Run seed; each row samples with a seed derived from it and its id."),
    click.option("--dtype", type=click.Choice(DTYPES)),
    click.option("--response-format", metavar="FILE.json",
                 help="Structured output for rows whose response_format column is null: a JSON file holding an "
                      'OpenAI response_format, {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}.'),
    # Checked by build_config like the pipeline key (one line naming the option), not by click.
    click.option("--prompt-format", metavar="|".join(PROMPT_FORMATS),
                 help="chat (default): a prompt goes to the model as one user message through its chat template; "
                 "raw: as is, for base models. A messages column always takes the template."),
]

# A previous run's starting points (batchspec.prior): `run` and `calibrate` alike.
PRIOR_RUN = click.option(
    "--prior-run", metavar="OUTPUT",
    help="A previous run's OUTPUT: each shard key's first shard starts under the arm that run predicted best for the "
         "key (where it ran the same engine, model and batch size); calibration goes on from there. With {date} "
         "(OUTPUT's template): the newest earlier run it names, none a cold start.")


def model_and_spec_options(func):
    """The pipeline, model, engine, spec and shard options."""
    for option in reversed(SHARED):
        func = option(func)
    return func


def sampling_options(func):
    """Batch size, sampling defaults and dtype."""
    for option in reversed(SAMPLING):
        func = option(func)
    return func
