"""Step 1, read: find the input files behind any fsspec URL and read them by chunks.

What this module owns:
- resolving INPUT (a file, a folder, a glob; local, file://, s3://, memory://, ...) to an ordered
  list of Parquet files, checking each footer and schema once, before any worker starts; or to
  Batch API request files (JSON lines, `.jsonl`), each read through once to find its lines;
- listing INPUT without reading it (`list_input`: paths and sizes, all a plan fingerprint needs);
- row identity and chunked reads for plan and group (Ray Data tasks, or in-process for small
  inputs): a `Chunk` is a run of row groups of one file, read with only the columns wanted and
  typed as in the unified schema.

What it does not: turning a row into an engine request (batchspec.parse, inside a worker), and
deciding which rows belong together (batchspec.plan, batchspec.group).

Row identity is (file, row index), carried as one int64 position (file index << 40 | row index).
When the input has no `id` column (or a row's id is null), the id is `<file path relative to
INPUT>#<row index>`, stable across runs; duplicate ids are refused by the plan. Ids and shard keys
are text: bytes in them that are not UTF-8 (Parquet readers do not check) are read as U+FFFD
(`valid_strings`), so no cell can stop the plan. Every column
except prompt, messages, id and the sampling columns passes through untouched.

A Batch API request file is read as a table of one row per request line (batchspec.request_lines,
which says what a line holds): its "row groups" are runs of consecutive lines of about
REQUEST_GROUP_BYTES, found when the file is opened, so plan and group read a request file by chunks
as they read Parquet.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Iterator

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from batchspec.errors import InputError, one_line
from batchspec.parse import BATCH_REQUEST, CONSUMED_COLUMNS, PROMPT_COLUMNS
from batchspec.request_lines import REQUEST_SCHEMA, is_request_file, request_columns, request_lines


@dataclass(frozen=True)
class InputFile:
    path: str  # as the filesystem names it (protocol stripped)
    rel: str  # relative to INPUT, used in generated ids
    size: int
    rows: int
    row_groups: tuple[tuple[int, int], ...] = ()  # (rows, uncompressed bytes) per row group
    line_groups: tuple[tuple[int, int], ...] = ()  # a request file: (byte offset, line number) of each row group's first line
    first_row: int = 0  # INPUT's rows in the files before this one

    @property
    def is_requests(self) -> bool:
        return is_request_file(self.path)


@dataclass(frozen=True)
class InputListing:
    """INPUT listed, not read: its Parquet files (paths as the filesystem names them, sizes)."""

    url: str
    files: tuple[tuple[str, int], ...]
    base: str  # generated ids are relative to this folder


@dataclass(frozen=True)
class InputSource:
    """The resolved input: ordered files, their shared schema and the filesystem to read them."""

    url: str
    files: tuple[InputFile, ...]
    schema: pa.Schema
    storage_options: tuple[tuple[str, object], ...] = ()

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        return filesystem(self.url, dict(self.storage_options))

    def passthrough_schema(self, output_names: tuple[str, ...]) -> pa.Schema:
        return passthrough_schema(self.schema, output_names)


def passthrough_schema(schema: pa.Schema, output_names: tuple[str, ...]) -> pa.Schema:
    """Input columns copied to the output; a clash with an output column is an input error."""
    keep = [f for f in schema if f.name not in CONSUMED_COLUMNS]
    for f in keep:
        if f.name in output_names:
            raise InputError(f"input column {f.name!r} clashes with the output column of that name; rename it")
    return pa.schema(keep)


def filesystem(url: str, storage_options: dict | None = None) -> fsspec.AbstractFileSystem:
    fs, _ = fsspec.core.url_to_fs(url, **(storage_options or {}))
    return fs


def list_input(url: str, storage_options: dict | None = None) -> InputListing:
    """INPUT's files (Parquet, or Batch API request files) and their sizes, from a listing (no file is opened)."""
    opts = storage_options or {}
    try:
        fs, root = fsspec.core.url_to_fs(url, **opts)
        paths = _list_parquet(fs, root)
        sizes = [fs.size(p) for p in paths]
        base = (root if not has_glob(root) and fs.isdir(root) else posixpath.dirname(paths[0])) if paths else ""
    except InputError:
        raise
    except Exception as exc:  # the backend's own error: unreachable bucket, bad credentials, ...
        raise InputError(f"cannot list input {url}: {one_line(exc)}") from exc
    if not paths:
        raise InputError(f"no input files (Parquet, or Batch API requests .jsonl) found at input {url}")
    return InputListing(url, tuple(zip(paths, sizes)), base)


def open_input(url: str | InputListing, storage_options: dict | None = None, shard_by: str | None = None) -> InputSource:
    """Resolve INPUT to its Parquet files and check their footers and columns, or to its Batch API
    request files and their lines (InputError if not)."""
    opts = storage_options or {}
    listing = url if isinstance(url, InputListing) else list_input(url, opts)
    fs = filesystem(listing.url, opts)
    kinds = {is_request_file(p) for p, _ in listing.files}
    if len(kinds) > 1:
        raise InputError(f"input {listing.url} holds both Batch API request files (.jsonl) and Parquet files; give one kind")
    if kinds == {True}:
        files = _open_requests(fs, listing)
        _check_columns(REQUEST_SCHEMA, listing.url, shard_by)
        return InputSource(listing.url, files, REQUEST_SCHEMA, tuple(sorted(opts.items())))
    files, schemas = [], []
    for path, size in listing.files:
        meta = _footer(fs, path)
        groups = tuple((meta.row_group(g).num_rows, meta.row_group(g).total_byte_size) for g in range(meta.num_row_groups))
        files.append(InputFile(path, _relative(path, listing.base), size, meta.num_rows, groups))
        schemas.append(meta.schema.to_arrow_schema())
    schema = _unify(schemas, [fs.unstrip_protocol(p) for p, _ in listing.files])
    _check_columns(schema, listing.url, shard_by)
    return InputSource(listing.url, tuple(files), schema, tuple(sorted(opts.items())))


def _relative(path: str, base: str) -> str:
    """A file's name relative to INPUT, as generated ids carry it: a URL's query (a signature, a
    token) and fragment are not part of it."""
    if "://" in path:
        path = path.split("?", 1)[0].split("#", 1)[0]
        base = base.split("?", 1)[0].split("#", 1)[0]
    return posixpath.relpath(path, base) if base else path


def _list_parquet(fs: fsspec.AbstractFileSystem, root: str) -> list[str]:
    if has_glob(root):
        found = fs.glob(root)
    elif fs.isdir(root):
        found = fs.find(root)
    elif fs.exists(root):
        return [root]
    else:
        raise InputError(f"input {fs.unstrip_protocol(root)} does not exist")
    # Hidden and marker files (_SUCCESS, .crc, _metadata) are never data, as in Spark and Ray Data.
    return sorted(p for p in found if not posixpath.basename(p).startswith(("_", ".")) and not fs.isdir(p))


def has_glob(path: str) -> bool:
    return any(ch in path for ch in "*?[")


def _footer(fs: fsspec.AbstractFileSystem, path: str) -> pq.FileMetaData:
    try:
        with fs.open(path, "rb") as f:
            return pq.ParquetFile(f).metadata
    except Exception as exc:
        raise InputError(f"input file {fs.unstrip_protocol(path)} is not readable Parquet: {one_line(exc)}") from exc


def _unify(schemas: list[pa.Schema], urls: list[str]) -> pa.Schema:
    first = schemas[0]
    for schema, url in zip(schemas[1:], urls[1:]):
        for field in schema:
            other = first.field(field.name) if field.name in first.names else None
            if other is not None and other.type != field.type and not pa.types.is_null(field.type) and not pa.types.is_null(other.type):
                raise InputError(f"input file {url}: column {field.name!r} is {field.type}, but {other.type} in {urls[0]}")
    try:
        return pa.unify_schemas(schemas)
    except pa.ArrowInvalid as exc:
        raise InputError(f"input files have incompatible schemas: {one_line(exc)}") from exc


def _check_columns(schema: pa.Schema, url: str, shard_by: str | None) -> None:
    names = schema.names
    if not any(c in names for c in (*PROMPT_COLUMNS, BATCH_REQUEST)):
        raise InputError(f"input {url} needs a 'prompt' (string) or 'messages' (list of {{role, content}}) column; found {names}")
    if shard_by and shard_by not in names:
        raise InputError(f"--shard-by column {shard_by!r} is not in input {url}; found {names}")


# ---- row identity and chunked reads (inside Ray Data tasks: plan and group) --------------------

POS = "__bs_pos"  # int64 column: file index << ROW_BITS | row index within the file (input order)
ID = "__bs_id"  # string column: the row's output id
ROW_BITS = 40


@dataclass(frozen=True)
class Chunk:
    """A run of consecutive row groups of one input file: the unit of one read task."""

    file_index: int
    groups: tuple[int, ...]
    first_row: int
    rows: int
    bytes: int  # uncompressed, from the footer


def position(file_index: int, first_row: int, rows: int) -> np.ndarray:
    """Input positions of `rows` consecutive rows: sortable in input order across files."""
    return (np.int64(file_index) << ROW_BITS) + np.arange(first_row, first_row + rows, dtype=np.int64)


def chunks(source: InputSource, target_bytes: int) -> list[Chunk]:
    """Consecutive row groups of each file, packed up to about `target_bytes` (uncompressed)."""
    out = []
    for fi, f in enumerate(source.files):
        groups, first, rows, size = [], 0, 0, 0
        for g, (g_rows, g_bytes) in enumerate(f.row_groups):
            if groups and size + g_bytes > target_bytes:
                out.append(Chunk(fi, tuple(groups), first, rows, size))
                groups, first, rows, size = [], first + rows, 0, 0
            groups.append(g)
            rows += g_rows
            size += g_bytes
        if groups:
            out.append(Chunk(fi, tuple(groups), first, rows, size))
    return out


def chunk_items(source: InputSource, target_bytes: int) -> list[dict]:
    """`chunks` as rows for `ray.data.from_items` (one read task each)."""
    return [{"file_index": c.file_index, "groups": list(c.groups), "first_row": c.first_row, "rows": c.rows, "bytes": c.bytes}
            for c in chunks(source, target_bytes)]


def chunks_of(batch: pa.Table) -> list[Chunk]:
    return [Chunk(d["file_index"], tuple(d["groups"]), d["first_row"], d["rows"], d["bytes"]) for d in batch.to_pylist()]


def read_chunk(source: InputSource, chunk: Chunk, columns: list[str] | None) -> pa.Table:
    """The chunk's rows (only `columns`, or every column), typed as in the unified input schema."""
    f = source.files[chunk.file_index]
    fs = source.fs
    wanted = columns if columns is not None else source.schema.names
    if f.is_requests:
        table = pa.concat_tables([_read_request_group(source, f, g) for g in chunk.groups])
        return _typed(source, table, wanted)
    try:
        with fs.open(f.path, "rb") as fh:
            pf = pq.ParquetFile(fh, pre_buffer=False)  # through a Python file, pre-buffering re-reads ranges
            present = [c for c in wanted if c in pf.schema_arrow.names]
            table = pf.read_row_groups(list(chunk.groups), columns=present)
    except Exception as exc:
        raise InputError(f"input file {fs.unstrip_protocol(f.path)} cannot be read: {one_line(exc)}") from exc
    if table.num_rows != chunk.rows:
        raise InputError(f"input file {fs.unstrip_protocol(f.path)} changed: row groups {list(chunk.groups)} hold {table.num_rows} rows, the footer said {chunk.rows}")
    return _typed(source, table, wanted)


def read_pieces(source: InputSource, chunk: Chunk, target_bytes: int) -> Iterator[tuple[Chunk, pa.Table]]:
    """The chunk's rows, every column, in consecutive pieces of about `target_bytes` decoded (at
    least PIECE_ROWS rows), each with the Chunk that names its rows: what reading a whole chunk at
    once would give, with memory bounded by a piece, whatever the footer says of the chunk's size
    (dictionary-encoded repeats are small there and large decoded)."""
    f = source.files[chunk.file_index]
    fs = source.fs
    if f.is_requests:  # a request file's row group is already small: a piece each
        first = chunk.first_row
        for g in chunk.groups:
            table = _read_request_group(source, f, g)
            yield Chunk(chunk.file_index, chunk.groups, first, table.num_rows, f.row_groups[g][1]), table
            first += table.num_rows
        return
    first, pending, size = chunk.first_row, [], 0
    try:
        with fs.open(f.path, "rb") as fh:
            pf = pq.ParquetFile(fh, pre_buffer=False, buffer_size=PIECE_READ_BYTES)  # column chunks read by the buffer, not whole
            present = [c for c in source.schema.names if c in pf.schema_arrow.names]
            for batch in pf.iter_batches(batch_size=PIECE_ROWS, row_groups=list(chunk.groups), columns=present):
                pending.append(batch)
                size += batch.nbytes
                if size >= target_bytes:
                    piece = pa.Table.from_batches(pending)
                    yield Chunk(chunk.file_index, chunk.groups, first, piece.num_rows, size), _typed(source, piece, source.schema.names)
                    first, pending, size = first + piece.num_rows, [], 0
            if pending:
                piece = pa.Table.from_batches(pending)
                yield Chunk(chunk.file_index, chunk.groups, first, piece.num_rows, size), _typed(source, piece, source.schema.names)
                first += piece.num_rows
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"input file {fs.unstrip_protocol(f.path)} cannot be read: {one_line(exc)}") from exc
    if first != chunk.first_row + chunk.rows:
        raise InputError(f"input file {fs.unstrip_protocol(f.path)} changed: row groups {list(chunk.groups)} hold "
                         f"{first - chunk.first_row} rows, the footer said {chunk.rows}")


PIECE_ROWS = 8  # rows per Parquet read batch of `read_pieces`: a row may be a very long prompt, and the reader holds several batches' worth
PIECE_READ_BYTES = 8 << 20  # read buffer per column chunk


def _typed(source: InputSource, table: pa.Table, wanted: list[str]) -> pa.Table:
    """`table`'s `wanted` columns typed as in the unified input schema (a missing one all null)."""
    if not wanted:
        return table  # no columns, but the row count
    fields = [source.schema.field(n) for n in wanted]
    arrays = [table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type) for f in fields]
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def row_ids(source: InputSource, chunk: Chunk, table: pa.Table) -> pa.Array:
    """Each row's output id: its `id` as a string, or `<file relative to INPUT>#<row index>`."""
    rows = np.arange(chunk.first_row, chunk.first_row + chunk.rows)
    generated = pc.binary_join_element_wise(source.files[chunk.file_index].rel, pa.array(rows.astype(str)), "#")
    if "id" not in table.column_names:
        return generated
    return pc.coalesce(as_strings(table.column("id").combine_chunks()), generated)


def key_strings(table: pa.Table, shard_by: str | None) -> pa.Array:
    """Each row's shard-by value as a string (null stays null); all null without shard_by."""
    if not shard_by:
        return pa.nulls(table.num_rows, pa.string())
    return as_strings(table.column(shard_by).combine_chunks())


def as_strings(col: pa.Array) -> pa.Array:
    """str() of each value, as Python prints it; strings and integers are converted by Arrow."""
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_integer(col.type):
        return valid_strings(col.cast(pa.string()))
    return pa.array([None if v is None else str(v) for v in col.to_pylist()], pa.string())


def valid_strings(col: pa.Array) -> pa.Array:
    """A string array as it is when it is valid UTF-8; else with each invalid byte sequence read as
    U+FFFD (the check is one pass; the repair, per value, only runs on a column that needs it)."""
    try:
        col.validate(full=True)
        return col
    except pa.ArrowInvalid:
        raw = col.cast(pa.large_binary() if pa.types.is_large_string(col.type) else pa.binary())
        return pa.array([None if v is None else v.decode("utf-8", "replace") for v in raw.to_pylist()], col.type)


# ---- Batch API request files (JSON lines) -----------------------------------------------------

REQUEST_GROUP_BYTES = 1 << 20  # a request file's row group: consecutive lines of about this many bytes


def _open_requests(fs: fsspec.AbstractFileSystem, listing: InputListing) -> tuple[InputFile, ...]:
    """Each request file read through once: its request lines cut into row groups."""
    files, first_row = [], 0
    for path, size in listing.files:
        groups, starts = [], []
        try:
            with fs.open(path, "rb") as fh:
                for offset, number, line in request_lines(fh):
                    if not groups or groups[-1][1] >= REQUEST_GROUP_BYTES:
                        groups.append([0, 0])
                        starts.append((offset, number))
                    groups[-1][0] += 1
                    groups[-1][1] += len(line)
        except Exception as exc:
            raise InputError(f"input file {fs.unstrip_protocol(path)} cannot be read: {one_line(exc)}") from exc
        rows = sum(n for n, _ in groups)
        files.append(InputFile(path, _relative(path, listing.base), size, rows, tuple(map(tuple, groups)), tuple(starts), first_row))
        first_row += rows
    return tuple(files)


def _read_request_group(source: InputSource, f: InputFile, group: int) -> pa.Table:
    """One row group of a request file: a row per request line (`REQUEST_SCHEMA`)."""
    rows, _ = f.row_groups[group]
    offset, number = f.line_groups[group]
    first = f.first_row + sum(n for n, _ in f.row_groups[:group])
    fs = source.fs
    try:
        with fs.open(f.path, "rb") as fh:
            fh.seek(offset)
            lines = []
            for item in request_lines(fh, offset, number):
                lines.append(item)
                if len(lines) == rows:
                    break
    except Exception as exc:
        raise InputError(f"input file {fs.unstrip_protocol(f.path)} cannot be read: {one_line(exc)}") from exc
    if len(lines) != rows:
        raise InputError(f"input file {fs.unstrip_protocol(f.path)} changed: {len(lines)} request lines from line {number}, {rows} when it was opened")
    columns = [request_columns(f.rel, n, line) for _, n, line in lines]
    table = pa.Table.from_pylist(columns, schema=REQUEST_SCHEMA)
    return table.set_column(3, "input_row", pa.array(np.arange(first, first + rows, dtype=np.int64)))

