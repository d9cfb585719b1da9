"""batchspec as a Ray Data stage: `generate(ds, config) -> Dataset`, for teams that already hold a
`ray.data.Dataset` (in the spirit of Ray Data LLM's `build_llm_processor`).

    import ray
    from batchspec.config.run import build_config
    from batchspec.ray_data import generate

    ds = ray.data.read_parquet("s3://bucket/prompts/")
    config = build_config("", "", model="smollm2-135m", shard_by="task", shard_size=64, max_tokens=32)
    out = generate(ds, config)          # lazy, like any Dataset: nothing runs until it is consumed
    out.write_parquet("s3://bucket/completions/")

The stage is one `map_batches` on an actor pool (`config.workers` actors at most, each holding one
engine for its life, with `config.worker` resources: the same `ShardWorker` as `batchspec run`).
Every batch of at most `shard_size` rows is a shard; its rows are split by the `shard_by` value and
each part is calibrated and generated like a shard of `batchspec run` (the same `run_shard`: the
same per-shard calibration, each key's part starting where the key's last part on the same actor
ended; a `response_format` column, with `config.response_format` for rows without one,
constrains rows as in a run). Each output row carries the output columns of stats.OutputRow (`id`,
`shard_id`, `text`, ..., `target_steps`) and the input's passthrough columns; a row that cannot run
becomes an error row, as in a run. A text `prompt` goes through the model's chat template as one
user message unless `config.prompt_format` is "raw" (as Ray Data LLM's chat-template stage does
before its engine); `messages` always do.

What it does not do (use `batchspec run` for these): the deterministic plan, `_shards/`,
exactly-once commit and resume, stats files. Ray Data owns retries and where the result goes, and
shards are the batches Ray Data forms, so they can differ between runs. A row without an `id`
gets `<hash of its batch's prompts>#<row in batch>`.
"""

from __future__ import annotations

import hashlib
import re

import pyarrow as pa

from batchspec.errors import InputError
from batchspec.prior import WHY as PRIOR_WHY

STAGE = "batchspec.ray_data.generate"


def generate(ds, config):
    """A lazy Dataset with one output row per row of `ds` (see the module docstring).

    `config` is a RunConfig (its input and output are ignored); validation of the engine and the
    spec happens here, once, before any actor starts, and so does the check of the columns where
    Ray Data knows the schema without running anything (a Parquet read, an in-memory dataset);
    otherwise the stage checks each batch's columns.
    """
    import ray.data

    from batchspec import preflight
    from batchspec.worker_pool import check_gpus_fit

    job = preflight.prepare(config, "ray_data.generate")
    schema = ds.schema(fetch_if_missing=False)
    if schema is not None:
        check_columns(list(schema.names), config.shard_by)
    seeds = job.prior().seeds
    check_gpus_fit(config.worker.num_gpus)  # Ray Data places an actor of N GPUs on one node
    return ds.map_batches(
        GenerateStage, fn_constructor_args=(job.worker_job(), config.shard_by, seeds), batch_size=config.shard_size, batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=config.workers),
        num_cpus=config.worker.num_cpus, num_gpus=config.worker.num_gpus or None,
    )


class GenerateStage:
    """The actor: one engine (loaded once), one call per batch."""

    def __init__(self, job, shard_by: str | None, seeds: dict | None = None):
        from batchspec.workers import ShardWorker

        self.worker = ShardWorker(job)
        self.worker.start()
        self.shard_by = shard_by
        self.seeds = seeds or {}  # a prior run's starting arm per key (batchspec.prior)

    def __call__(self, batch: pa.Table) -> pa.Table:
        from batchspec.parse import CONSUMED_COLUMNS, parse_rows
        from batchspec.write import output_schema

        check_columns(batch.column_names, self.shard_by)
        passthrough = pa.schema([f for f in batch.schema if f.name not in CONSUMED_COLUMNS])
        schema = output_schema(passthrough)
        ids = _ids(batch)
        parts, order = [], []
        for key, rows in _by_key(batch, self.shard_by):
            part = batch.take(pa.array(rows, pa.int64()))
            part_ids = [ids[i] for i in rows]
            shard_id = _shard_id(key, part_ids)
            done = self.worker.generate(shard_id, key, parse_rows(part, part_ids, self.worker.job.defaults),
                                        self.seeds.get(key), prior_why=PRIOR_WHY)
            parts.append(done.output_table(shard_id, part.select(passthrough.names), schema))
            order += rows
        table = pa.concat_tables(parts)
        inverse = [0] * len(order)
        for at, row in enumerate(order):
            inverse[row] = at
        return table.take(pa.array(inverse, pa.int64()))

    def __del__(self):
        worker = getattr(self, "worker", None)
        if worker is not None:
            worker.close()


def check_columns(names: list[str], shard_by: str | None) -> None:
    """The columns the stage needs are there and none clashes with an output column."""
    from batchspec.parse import CONSUMED_COLUMNS, PROMPT_COLUMNS
    from batchspec.stats import OUTPUT_NAMES

    if not any(c in names for c in PROMPT_COLUMNS):
        raise InputError(f"{STAGE}: needs a 'prompt' (string) or 'messages' (list of {{role, content}}) column; found {names}")
    if shard_by and shard_by not in names:
        raise InputError(f"{STAGE}: shard_by column {shard_by!r} is not in the dataset; found {names}")
    for name in names:
        if name not in CONSUMED_COLUMNS and name in OUTPUT_NAMES:
            raise InputError(f"{STAGE}: column {name!r} clashes with the output column of that name; rename it")


def _ids(batch: pa.Table) -> list[str]:
    """The `id` column as strings; a row without one gets `<hash of its batch's prompts>#<row>`.
    Read as a run reads them (batchspec.read): bytes that are not UTF-8 become U+FFFD, and a prompt
    that cannot be read fails its own row later (batchspec.parse), never the batch."""
    from batchspec.parse import cells
    from batchspec.read import as_strings

    given = as_strings(batch.column("id").combine_chunks()).to_pylist() if "id" in batch.column_names else [None] * batch.num_rows
    if all(v is not None for v in given):
        return given
    prompts = batch.column("prompt") if "prompt" in batch.column_names else batch.column("messages")
    digest = hashlib.sha256(repr(cells(prompts)).encode()).hexdigest()[:10]
    return [v if v is not None else f"{digest}#{i}" for i, v in enumerate(given)]


def _by_key(batch: pa.Table, shard_by: str | None) -> list[tuple[str | None, list[int]]]:
    """Row positions per shard-by value (as a string, as a run reads it; null last), values in sorted order."""
    from batchspec.read import key_strings

    if not shard_by:
        return [(None, list(range(batch.num_rows)))]
    groups: dict[str | None, list[int]] = {}
    for i, v in enumerate(key_strings(batch, shard_by).to_pylist()):
        groups.setdefault(v, []).append(i)
    return [(k, groups[k]) for k in sorted(groups, key=lambda k: (k is None, k or ""))]


def _shard_id(key: str | None, ids: list[str]) -> str:
    """`<key slug>-<hash of the part's ids>`: the same rows give the same id."""
    digest = hashlib.sha256("\n".join(ids).encode()).hexdigest()[:12]
    slug = re.sub(r"[^A-Za-z0-9_.=-]+", "_", key)[:40].strip("_.") if key is not None else ""
    return f"{slug}-{digest}" if slug else digest
