"""Step 2b, group: materialize each shard's input rows once, under OUTPUT/_shards/<shard_id>.parquet.

The plan (batchspec.plan) says which rows go to which shard without holding rows: per shard key,
the input position of every shard's first row. This module moves the rows there with one Ray Data
shuffle, so that a shard worker later reads one file, its own, and nothing else:

    chunks of input row groups ──map_batches: read every column, tag each row with its shard──>
    groupby(shard).map_groups: sort the shard's rows into input order, write one Parquet file

Why `groupby(...).map_groups` and not `sort` or `repartition`: the unit we need together is
exactly one shard (at most `shard_size` rows, so a group always fits in a task), and the UDF that
receives it can write it whole, atomically, under a deterministic name. A global `sort` would
order rows we only need co-located; `repartition(keys=...)` co-locates hash partitions, not shards,
and would leave the per-shard split and write to us anyway. The shuffle is the pull-based sort
shuffle for inputs of up to SORT_SHUFFLE_BYTES (uncompressed) and Ray Data's default above
(`batchspec.plan.shuffle_for`: the default starts aggregator actors, seconds of fixed cost per
shuffle); partitions are sized to about 128 MB of input each.

Rows are tagged with their shard by a binary search of their input position among the plan's
shard starts for their key, so tagging needs no join and no per-row state on the driver. Each
shard file keeps every input column (typed as in the unified input schema) plus two internal
columns: `__bs_pos` (file index << 40 | row index: input order and the shard's fingerprint) and
`__bs_id` (the row's id as the output will carry it). The driver receives one small record per
shard (rows, fingerprint, bytes) and checks it against the plan.

Commit protocol: shard files are written atomically (batchspec.write.Output.put); OUTPUT/_plan.json
is written after every shard file exists and is the commit mark of plan + group. A run that finds
no _plan.json regroups from scratch (clearing _shards/ first); one that finds it uses the files.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from batchspec.errors import OutputError
from batchspec.parse import PARSED_COLUMNS, RowDefaults, parse_rows
from batchspec.plan import Plan, ShardPlan, fingerprint_positions, plan_locally, shuffle_for
from batchspec.read import (ID, POS, Chunk, InputSource, chunk_items, chunks, chunks_of, key_strings, position, read_chunk, read_pieces,
                            row_ids, valid_strings)
from batchspec.write import Output

SHARD = "__bs_shard"  # int64: the shard's ordinal in the plan (only while shuffling)
INTERNAL = (POS, ID)  # columns of a shard file that are not input columns
PARTITION_BYTES = 128 << 20  # uncompressed input bytes per read task and per shuffle partition
LOCAL_PIECE_BYTES = 4 << 20  # decoded input bytes read at a time by the in-process group
SORT_SHUFFLE_BYTES = 1 << 30  # groups of up to this many uncompressed input bytes use the sort shuffle (plan.shuffle_for)


# ---- group: the shuffle that writes OUTPUT/_shards/ ----------------------------------------------

_CACHE: dict[str, object] = {}


def _shared(ref_box: list):
    """A broadcast object, fetched once per worker process (the ref is boxed so Ray does not
    resolve it into every task's arguments)."""
    import ray

    ref = ref_box[0]
    key = ref.hex()
    if key not in _CACHE:
        _CACHE.clear()
        _CACHE[key] = ray.get(ref)
    return _CACHE[key]


def _assignment(shards: tuple[ShardPlan, ...]) -> dict[tuple[bool, str], tuple[int, np.ndarray]]:
    """(key is null, key) -> (ordinal of the key's first shard, its shards' start positions)."""
    out: dict[tuple[bool, str], tuple[int, list[int]]] = {}
    for n, s in enumerate(shards):
        out.setdefault((s.shard_key is None, s.shard_key or ""), (n, []))[1].append(s.start)
    return {k: (base, np.array(starts, np.int64)) for k, (base, starts) in out.items()}


def _tag(batch: pa.Table, source: InputSource, shard_by: str | None, assignment: list) -> pa.Table:
    return tag_rows(batch, source, shard_by, _shared(assignment))


def tag_rows(batch: pa.Table, source: InputSource, shard_by: str | None, starts_of: dict) -> pa.Table:
    """Every column of the chunks in `batch`, plus position, id and shard ordinal per row."""
    return pa.concat_tables([tag_chunk(c, source, shard_by, starts_of) for c in chunks_of(batch)])


def tag_chunk(c: Chunk, source: InputSource, shard_by: str | None, starts_of: dict, t: pa.Table | None = None) -> pa.Table:
    """One chunk's rows (`t`, or read here), every column, plus position, id and shard ordinal per row."""
    t = read_chunk(source, c, None) if t is None else t
    pos = position(c.file_index, c.first_row, c.rows)
    enc = pc.dictionary_encode(key_strings(t, shard_by), null_encoding="encode")
    idx = enc.indices.to_numpy(zero_copy_only=False)
    order = np.argsort(idx, kind="stable")
    bounds = np.searchsorted(idx[order], np.arange(len(enc.dictionary) + 1))
    shard = np.empty(c.rows, np.int64)
    for d, value in enumerate(enc.dictionary.to_pylist()):
        rows = order[bounds[d] : bounds[d + 1]]
        base, starts = starts_of[(value is None, value or "")]
        shard[rows] = base + np.searchsorted(starts, pos[rows], side="right") - 1
    return t.append_column(POS, pa.array(pos)).append_column(ID, row_ids(source, c, t)).append_column(SHARD, pa.array(shard))


def _write(group: pa.Table, output: Output, shard_ids: list) -> pa.Table:
    return write_shard(group, output, _shared(shard_ids))


def write_shard(group: pa.Table, output: Output, shard_ids: list[str]) -> pa.Table:
    """One shard's rows, in input order, written whole under OUTPUT/_shards/."""
    n = group.column(SHARD)[0].as_py()
    table = group.sort_by(POS).drop_columns([SHARD])
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    output.put(output.shard_input_path(shard_ids[n]), buf.getvalue())
    fp = fingerprint_positions(table.column(POS).to_numpy())
    return pa.table({SHARD: [n], "rows": [table.num_rows], "fingerprint": [fp], "bytes": [buf.tell()]})


def group_shards(source: InputSource, plan: Plan, output: Output, local: bool | None = None) -> int:
    """Write every shard's input rows to OUTPUT/_shards/ with one Ray Data shuffle (or, for a small
    input, in this process: batchspec.plan.plan_locally); returns the bytes written. Each written
    shard is checked against the plan (rows and fingerprint)."""
    local = plan_locally(source) if local is None else local
    written = (_group_locally if local else _group_with_ray_data)(source, plan, output)
    assert len(written) == len(plan.shards), (len(written), len(plan.shards))
    for w in written:
        s = plan.shards[w[SHARD]]
        assert (w["rows"], w["fingerprint"]) == (s.rows, s.fingerprint), (s.shard_id, w, s)
    return sum(w["bytes"] for w in written)


def _group_locally(source: InputSource, plan: Plan, output: Output) -> list[dict]:
    """The shuffle in this process, streamed: the input is read in input order by pieces of about
    LOCAL_PIECE_BYTES, and each shard is written as soon as its last row is read, so memory holds
    a piece and the shards still open (for keys interleaved row by row, about one per key), never
    the input."""
    starts_of = _assignment(plan.shards)
    shard_ids = [s.shard_id for s in plan.shards]
    need = [s.rows for s in plan.shards]
    open_shards: dict[int, list[pa.Table]] = {}
    written = []
    for c in chunks(source, PARTITION_BYTES):
        for piece, table in read_pieces(source, c, LOCAL_PIECE_BYTES):
            for n, rows in by_shard(tag_chunk(piece, source, plan.shard_by, starts_of, table)):
                open_shards.setdefault(n, []).append(rows)
                need[n] -= rows.num_rows
                if need[n] == 0:
                    written.append(write_shard(pa.concat_tables(open_shards.pop(n)), output, shard_ids).to_pylist()[0])
    assert not open_shards, sorted(open_shards)  # the plan counted every shard's rows in this input
    return written


def by_shard(table: pa.Table):
    """(shard ordinal, that shard's rows in their order in `table`) for each shard present."""
    shard = table.column(SHARD).to_numpy()
    order = np.argsort(shard, kind="stable")
    ordinals, firsts = np.unique(shard[order], return_index=True)
    for n, lo, hi in zip(ordinals.tolist(), firsts, [*firsts[1:], len(order)]):
        yield n, table.take(pa.array(order[lo:hi]))


def group_sorts(nbytes: int) -> bool:
    """Whether a group moving `nbytes` of uncompressed input shuffles with the sort shuffle (plan.shuffle_for)."""
    return nbytes <= SORT_SHUFFLE_BYTES


def _group_with_ray_data(source: InputSource, plan: Plan, output: Output) -> list[dict]:
    import ray
    import ray.data

    shards = plan.shards
    items = chunk_items(source, PARTITION_BYTES)
    nbytes = sum(i["bytes"] for i in items)
    partitions = max(1, min(len(shards), math.ceil(nbytes / PARTITION_BYTES)))
    assignment = [ray.put(_assignment(shards))]
    shard_ids = [ray.put([s.shard_id for s in shards])]
    with shuffle_for(sort=group_sorts(nbytes)):
        tagged = ray.data.from_items(items, override_num_blocks=max(1, len(items))).map_batches(
            _tag, batch_size=1, batch_format="pyarrow", fn_kwargs={"source": source, "shard_by": plan.shard_by, "assignment": assignment})
        return tagged.groupby(SHARD, num_partitions=partitions).map_groups(
            _write, batch_format="pyarrow", fn_kwargs={"output": output, "shard_ids": shard_ids}).take_all()


# ---- a few shards' rows without the shuffle (`batchspec calibrate`'s sample) ------------------------


def read_shards(source: InputSource, plan: Plan, wanted: list[int]) -> dict[int, pa.Table]:
    """The input rows of the plan's shards `wanted` (ordinals), each in input order, tagged as
    `group_shards` tags them; nothing is written. Chunks are read in input order from the first
    wanted shard's start and the scan stops as soon as every wanted shard is complete, so a key's
    first shard (its first `shard_size` rows) costs a read of the input up to its last row."""
    starts_of = _assignment(plan.shards)
    need = {n: plan.shards[n].rows for n in wanted}
    parts: dict[int, list[pa.Table]] = {n: [] for n in wanted}
    first = min((plan.shards[n].start for n in wanted), default=0)
    for c in chunks(source, PARTITION_BYTES):
        if not need:
            break
        if int(position(c.file_index, c.first_row + c.rows - 1, 1)[0]) < first:
            continue
        for piece, table in read_pieces(source, c, LOCAL_PIECE_BYTES):  # in this process: bounded by a piece
            if not need:
                break
            t = tag_chunk(piece, source, plan.shard_by, starts_of, table)
            t = t.filter(pc.is_in(t.column(SHARD), pa.array(list(need), pa.int64())))
            for n, mine in by_shard(t):
                mine = mine.drop_columns([SHARD])
                parts[n].append(mine)
                need[n] -= mine.num_rows
                if need[n] == 0:
                    del need[n]
    assert not need, need  # the plan counted these rows in this input
    out = {n: pa.concat_tables(parts[n]) for n in wanted}
    for n, table in out.items():
        assert fingerprint_positions(table.column(POS).to_numpy()) == plan.shards[n].fingerprint, plan.shards[n]
    return out


# ---- reading one shard back (inside a worker) ------------------------------------------------------


def read_shard_input(output: Output, shard: ShardPlan) -> pa.Table:
    """The shard's input rows, in input order, from its own file (and nothing else)."""
    path = output.shard_input_path(shard.shard_id)
    fs = output.fs
    try:
        # One whole read (a single GET on object stores): parquet through a Python file object
        # reads the footer and, with pre-buffering, column ranges more than once (3.2x measured).
        table = pq.read_table(pa.BufferReader(fs.cat_file(path)))
    except FileNotFoundError:
        raise OutputError(f"shard file {fs.unstrip_protocol(path)} is missing; rerun with --no-resume to plan again") from None
    got = fingerprint_positions(table.column(POS).to_numpy()) if POS in table.column_names else None
    if table.num_rows != shard.rows or got != shard.fingerprint:
        raise OutputError(f"shard file {fs.unstrip_protocol(path)} does not match the plan ({table.num_rows} rows, "
                          f"fingerprint {got}; plan: {shard.rows}, {shard.fingerprint}); rerun with --no-resume")
    return table


def shard_ids(table: pa.Table) -> list[str]:
    """A shard file's output ids (`__bs_id`), as text whatever bytes the input held."""
    return valid_strings(table.column(ID).combine_chunks()).to_pylist()


@dataclass(frozen=True)
class RowCheck:
    """The rows of a plan that will fail as they are parsed (`--plan-only`): how many, and the first."""

    rows: int
    failing: int
    first: str | None = None  # "<id>: <error>"


def check_rows(output: Output, plan: Plan, defaults: RowDefaults, skip: set[str] = frozenset()) -> RowCheck:
    """Parse every row of the plan's shard files (but those in `skip`) as a worker will, one shard
    at a time, reading only the columns parsing takes: the rows that will be error rows before any
    model sees them (rows too long for the context are the engine's to find)."""
    fs, failing, first, rows = output.fs, 0, None, 0
    for shard in plan.shards:
        if shard.shard_id in skip:
            continue
        with fs.open(output.shard_input_path(shard.shard_id), "rb") as f:
            shard_file = pq.ParquetFile(f, pre_buffer=False)
            wanted = [n for n in shard_file.schema_arrow.names if n in (ID, *PARSED_COLUMNS)]
            for batch in shard_file.iter_batches(batch_size=CHECK_ROWS, columns=wanted):  # a few rows at a time: prompts may be long
                table = pa.Table.from_batches([batch])
                for parsed in parse_rows(table, shard_ids(table), defaults):
                    rows += 1
                    if parsed.error is not None:
                        failing += 1
                        first = first or f"{parsed.request.id}: {parsed.error}"
    return RowCheck(rows, failing, first)


CHECK_ROWS = 8
