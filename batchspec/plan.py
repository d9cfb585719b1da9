"""Step 2, plan: which input rows go to which shard, decided once with Ray Data and saved as
OUTPUT/_plan.json (small: per-shard counts and fingerprints, never rows).

Rows are grouped by the shard-by value (groups in sorted key order, null key last, rows in input
order inside a group) and each group is cut into shards of at most `shard_size` rows, so every
workload gets its own calibration. How, without rows on the driver:

1. Ray Data reads only the `id` and shard-by columns, one task per run of row groups
   (`read.chunks`), and tags each row with its input position (file index << 40 | row index).
2. Duplicate ids: `groupby(id).count()`, filtered to counts above one, in Ray Data; the driver
   sees at most the first duplicate.
3. Cutting: `groupby(key).map_groups` sorts each key's positions and emits one record per shard
   (its first position, its row count, and the fingerprint of its positions). Only these records
   reach the driver: per-shard metadata, nothing per row.

Both shuffles run as Ray Data's pull-based sort shuffle for inputs of up to SORT_SHUFFLE_ROWS
rows and with Ray Data's default above (`shuffle_for`).

Small inputs (at most LOCAL_BYTES uncompressed, from the footers) run the same per-chunk functions
in the driver's process instead: a Ray Data job costs seconds of fixed overhead (tasks, a shuffle,
stats actors), which at that size is all of the cost, while the rows involved are a few MB. Both
paths give the same plan; a test checks it.

A shard is thus named by its key and the input position of its first row; `batchspec.group`
finds every row's shard by a binary search among those starts. The plan is a pure function of the
input (files, sizes, keys, ids) and the options (shard_by, shard_size): the same input and options
always give the same shards, ids and fingerprints.

The plan's fingerprint covers the input files (paths and sizes) and the options that change the
plan; it can be computed from a listing alone, so a resume checks it before reading anything. A
resume against an OUTPUT whose plan has another fingerprint is refused (`check_resume`).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import math
import os
import re
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchspec.errors import InputError, OutputError
from batchspec.redact import redact_text
from batchspec.read import ID, POS, InputSource, chunk_items, chunks_of, key_strings, position, read_chunk, row_ids

PLAN_VERSION = 2
SCAN_BYTES = 64 << 20  # uncompressed input bytes per key-scan task (only two columns are read)
LOCAL_BYTES = 32 << 20  # inputs up to this size uncompressed are planned and grouped in-process
SORT_SHUFFLE_ROWS = 100_000  # plans of up to this many rows shuffle with the sort shuffle (see shuffle_for)


def plan_locally(source: InputSource) -> bool:
    """Small inputs skip Ray Data's fixed per-job cost (see the module docstring). Small by their
    uncompressed size from the footers, not their size on disk: zstd makes 400 MB of repetitive
    prompts 50 KB. (Dictionary-encoded repeats are small even uncompressed: the in-process group
    streams, so its memory does not depend on this estimate.)"""
    return sum(b for f in source.files for _, b in f.row_groups) <= LOCAL_BYTES


@dataclass(frozen=True)
class ShardPlan:
    """One shard: id, shard-by value, row count, input position of its first row, fingerprint of
    its rows' positions (checked when the shard's file is written and when a worker reads it)."""

    shard_id: str
    shard_key: str | None
    rows: int
    start: int
    fingerprint: str


@dataclass(frozen=True)
class RunIdentity:
    """What a run's rows' text depends on (the model and its fingerprint, engine, prompt format,
    generation defaults, response format, arms, dtype: batchspec.identity builds it), as a
    canonical JSON record and its digest. A resume or rerun into an OUTPUT of another identity
    with shards committed is refused (`check_identity`), so no OUTPUT mixes rows of two settings."""

    digest: str
    options: dict  # option name -> canonical JSON value

    @classmethod
    def of(cls, options: dict) -> "RunIdentity":
        canonical = json.loads(json.dumps(options, sort_keys=True, default=str))
        text = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
        return cls(hashlib.sha256(text.encode()).hexdigest()[:16], canonical)

    def differences(self, other: "RunIdentity") -> list[str]:
        """`name: this != other` for each option that differs, values shortened to one line."""
        names = sorted(set(self.options) | set(other.options))
        return [f"{n}: {_short(self.options.get(n))} != {_short(other.options.get(n))}"
                for n in names if self.options.get(n) != other.options.get(n)]


def _short(value, limit: int = 60) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":")) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Plan:
    fingerprint: str
    input_url: str
    files: tuple[tuple[str, int, int], ...]  # (path, size, rows)
    shard_by: str | None
    shard_size: int
    rows: int
    schema: str  # the unified input schema, Arrow IPC, base64
    shards: tuple[ShardPlan, ...]
    identity: RunIdentity | None = None  # the run's options the committed shards were made with

    @property
    def arrow_schema(self) -> pa.Schema:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(self.schema)))

    def to_json(self) -> str:
        doc = asdict(self)
        doc["version"] = PLAN_VERSION
        doc["shards"] = [asdict(s) for s in self.shards]
        if self.identity is None:
            doc.pop("identity")
        return json.dumps(doc, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        doc = json.loads(text)
        if doc.pop("version", None) != PLAN_VERSION:
            return cls(fingerprint=doc.get("fingerprint", "?"), input_url="", files=(), shard_by=None, shard_size=0, rows=0, schema="", shards=())
        shards = tuple(ShardPlan(**s) for s in doc.pop("shards"))
        files = tuple(tuple(f) for f in doc.pop("files"))
        identity = doc.pop("identity", None)  # a plan written before runs had an identity has none
        return cls(shards=shards, files=files, identity=RunIdentity(**identity) if identity else None, **doc)


def fingerprint(files: list[tuple[str, int]], shard_by: str | None, shard_size: int) -> str:
    """Of the input listing (paths, sizes) and the plan options: computable without reading data.
    Paths are taken without their secrets (`redact_text`): a signed URL signed anew names the same file."""
    doc = {"version": PLAN_VERSION, "files": [[redact_text(p), size] for p, size in files], "shard_by": shard_by, "shard_size": shard_size}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def make_plan(source: InputSource, shard_by: str | None, shard_size: int, local: bool | None = None) -> Plan:
    """The plan; `local` None decides by size (plan_locally), True/False force a path."""
    assert shard_size >= 1, shard_size
    local = plan_locally(source) if local is None else local
    records = (cut_shards_locally if local else cut_shards)(source, shard_by, shard_size)
    shards = tuple(
        ShardPlan(_shard_id(n, None if r["knull"] else r["key"]), None if r["knull"] else r["key"], int(r["rows"]), int(r["start"]), r["fingerprint"])
        for n, r in enumerate(records)
    )
    assert sum(s.rows for s in shards) == source.rows, (sum(s.rows for s in shards), source.rows)
    return Plan(
        fingerprint=fingerprint([(f.path, f.size) for f in source.files], shard_by, shard_size),
        input_url=redact_text(source.url),
        files=tuple((redact_text(f.path), f.size, f.rows) for f in source.files),
        shard_by=shard_by,
        shard_size=shard_size,
        rows=source.rows,
        schema=base64.b64encode(source.schema.serialize().to_pybytes()).decode(),
        shards=shards,
    )


def cut_shards(source: InputSource, shard_by: str | None, shard_size: int) -> list[dict]:
    """Ray Data: scan ids and keys, refuse duplicate ids, cut each key's rows into shards. One
    record per shard, in plan order (keys sorted, null key last; a key's shards in input order)."""
    import ray.data

    items = chunk_items(source, SCAN_BYTES)
    with shuffle_for(sort=plan_sorts(source.rows)):
        scan = ray.data.from_items(items, override_num_blocks=max(1, len(items)))
        keys = scan.map_batches(_scan, batch_size=1, batch_format="pyarrow", fn_kwargs={"source": source, "shard_by": shard_by}).materialize()
        if ID in keys.schema().names:
            counts = keys.select_columns([ID]).groupby(ID, num_partitions=_partitions(source.rows, 1_000_000)).count()
            dup = counts.map_batches(_duplicates, batch_format="pyarrow", batch_size=None).take(1)
            if dup:
                raise InputError(f"input {source.url} has duplicate id {dup[0][ID]!r}; ids must be unique")
        grouped = keys.select_columns([POS, "knull", "key"]).groupby(["knull", "key"], num_partitions=_partitions(source.rows, 2_000_000))
        records = grouped.map_groups(_cut, batch_format="pyarrow", fn_kwargs={"shard_size": shard_size}).take_all()
    records.sort(key=lambda r: (r["knull"], r["key"], r["j"]))
    return records


def cut_shards_locally(source: InputSource, shard_by: str | None, shard_size: int) -> list[dict]:
    """`cut_shards` in this process, with the same per-chunk and per-key functions."""
    tables = [_scan(pa.Table.from_pylist([item]), source, shard_by) for item in chunk_items(source, SCAN_BYTES)]
    keys = pa.concat_tables(tables) if tables else pa.table({POS: pa.array([], pa.int64())})
    if ID in keys.schema.names:
        counts = pc.value_counts(keys.column(ID))
        dup = counts.filter(pc.greater(counts.field("counts"), 1))
        if len(dup):
            raise InputError(f"input {source.url} has duplicate id {dup[0]['values'].as_py()!r}; ids must be unique")
    records: list[dict] = []
    groups: dict[tuple[bool, str], list[int]] = {}
    if keys.num_rows:
        knulls, vals = keys.column("knull").to_pylist(), keys.column("key").to_pylist()
        for i, k in enumerate(zip(knulls, vals)):
            groups.setdefault(k, []).append(i)
    for (knull, key), rows in groups.items():
        records += _cut(keys.select([POS, "knull", "key"]).take(pa.array(rows)), shard_size).to_pylist()
    records.sort(key=lambda r: (r["knull"], r["key"], r["j"]))
    return records


def plan_sorts(rows: int) -> bool:
    """Whether the plan of an input of `rows` rows shuffles with the sort shuffle (`shuffle_for`)."""
    return rows <= SORT_SHUFFLE_ROWS


@contextlib.contextmanager
def shuffle_for(sort: bool):
    """Ray Data's pull-based sort shuffle (`sort`) or its default for the datasets created inside
    the block (Ray Data binds a dataset's DataContext when the dataset is created).

    The default (`shuffle_v2`) starts aggregator actors, seconds per shuffle before any row moves;
    the sort shuffle runs as plain tasks, but aggregates group by group. So small jobs take the
    sort shuffle and large ones the default, at the sizes `SORT_SHUFFLE_ROWS` (the plan, whose
    duplicate-id check has a group per row) and `group.SORT_SHUFFLE_BYTES` (the group, a group per
    shard) name (docs/pipeline.md, "Scale"). The user's own choice,
    RAY_DATA_DEFAULT_SHUFFLE_STRATEGY, always wins."""
    import ray.data

    ctx = ray.data.DataContext.get_current()
    before = ctx.shuffle_strategy
    if sort and "RAY_DATA_DEFAULT_SHUFFLE_STRATEGY" not in os.environ:
        ctx.shuffle_strategy = "sort_shuffle_pull_based"
    try:
        yield ctx.shuffle_strategy
    finally:
        ctx.shuffle_strategy = before


def _partitions(rows: int, per: int) -> int:
    """Shuffle partitions for `rows` small records: Ray's default (200) costs seconds of task
    overhead per shuffle on a small cluster for nothing."""
    return max(1, min(200, math.ceil(rows / per)))


def _scan(batch: pa.Table, source: InputSource, shard_by: str | None) -> pa.Table:
    """Per row of the chunks in `batch`: input position, key (null flag + value) and, when the
    input has ids, the id. Never the prompt."""
    columns = list(dict.fromkeys(c for c in ("id", shard_by) if c and c in source.schema.names))
    out = []
    for c in chunks_of(batch):
        t = read_chunk(source, c, columns)
        key = key_strings(t, shard_by)
        cols = {POS: pa.array(position(c.file_index, c.first_row, c.rows)), "knull": pc.is_null(key), "key": pc.fill_null(key, "")}
        if "id" in source.schema.names:
            cols[ID] = row_ids(source, c, t)
        out.append(pa.table(cols))
    return pa.concat_tables(out)


def _duplicates(batch: pa.Table) -> pa.Table:
    return batch.filter(pc.greater(batch.column("count()"), 1))


def _cut(group: pa.Table, shard_size: int) -> pa.Table:
    """One key's rows -> one record per shard: index within the key, first position, rows, fingerprint."""
    pos = np.sort(group.column(POS).to_numpy())
    n = math.ceil(len(pos) / shard_size)
    cuts = [pos[j * shard_size : (j + 1) * shard_size] for j in range(n)]
    return pa.table({
        "knull": pa.array([group.column("knull")[0].as_py()] * n, pa.bool_()),
        "key": pa.array([group.column("key")[0].as_py()] * n, pa.string()),
        "j": pa.array(range(n), pa.int64()),
        "start": pa.array([int(c[0]) for c in cuts], pa.int64()),
        "rows": pa.array([len(c) for c in cuts], pa.int64()),
        "fingerprint": pa.array([fingerprint_positions(c) for c in cuts], pa.string()),
    })


def fingerprint_positions(pos: np.ndarray) -> str:
    """A shard's fingerprint: its rows' input positions, in order (with the plan's fingerprint of
    the input, this names the shard's content)."""
    return hashlib.sha256(np.ascontiguousarray(pos, dtype="<i8").tobytes()).hexdigest()[:16]


def _shard_id(n: int, key: str | None) -> str:
    """`00003-code`: the ordinal keeps ids unique and sorted; the key slug keeps them readable."""
    slug = re.sub(r"[^A-Za-z0-9_.=-]+", "_", key)[:40].strip("_.") if key is not None else ""
    return f"{n:05d}-{slug}" if slug else f"{n:05d}"


def check_resume(existing: Plan | None, fingerprint: str, start_over: str = "--no-resume") -> None:
    """Refuse to resume into an OUTPUT that holds a run of another input or plan."""
    if existing is not None and existing.fingerprint != fingerprint:
        raise OutputError(
            f"OUTPUT holds a run of a different input/plan (fingerprint {existing.fingerprint} != {fingerprint}); "
            f"use a new OUTPUT or {start_over}"
        )


def check_identity(existing: Plan, identity: RunIdentity, committed: int, start_over: str) -> None:
    """Refuse to resume or rerun, with other options, an OUTPUT that holds committed shards: one
    line naming each option that differs (OUTPUT's value first). With nothing committed there is
    nothing to mix: the caller binds the plan to the new options."""
    if committed and existing.identity is not None and existing.identity.digest != identity.digest:
        diff = existing.identity.differences(identity)
        raise OutputError(
            f"OUTPUT holds {committed} shard(s) made with other options ({'; '.join(diff)}); "
            f"use another OUTPUT, or {start_over} to start over"
        )
