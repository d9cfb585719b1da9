"""Step 1, read: find the input Parquet files behind any fsspec URL and turn rows into requests.

What this module owns:
- resolving INPUT (a file, a folder, a glob; local, file://, s3://, memory://, ...) to an ordered
  list of Parquet files, checking each footer and schema once, before any worker starts;
- listing INPUT without reading it (`list_input`: paths and sizes, all a plan fingerprint needs);
- row identity and chunked reads for the Ray Data tasks of plan and group: a `Chunk` is a run of
  row groups of one file, read with only the columns wanted and typed as in the unified schema;
- turning each row into an engine `Request` or a one-line per-row error (inside a worker);
- `scan_keys` / `read_rows`: the small in-process key scan `batchspec calibrate` uses on a sample.

Row identity is (file, row index), carried as one int64 position (file index << 40 | row index). When the input has no `id` column (or a row's id is null), the id
is generated as `<file path relative to INPUT>#<row index>`, stable across runs. Duplicate ids are
refused up front with an InputError naming the id: an output keyed by id must not be ambiguous.
Every column except prompt, messages, id and the sampling columns passes through untouched.
"""

from __future__ import annotations

import bisect
import json
import math
import posixpath
import zlib
from dataclasses import dataclass

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow.fs import FSSpecHandler, PyFileSystem

from batchspec.engine.base import Request, SamplingParams
from batchspec.errors import InputError, one_line

PROMPT_COLUMNS = ("prompt", "messages")
SAMPLING_COLUMNS = ("max_tokens", "temperature", "top_p", "seed", "stop")
CONSUMED_COLUMNS = (*PROMPT_COLUMNS, "id", *SAMPLING_COLUMNS)


@dataclass(frozen=True)
class InputFile:
    path: str  # as the filesystem names it (protocol stripped)
    rel: str  # relative to INPUT, used in generated ids
    size: int
    rows: int
    row_groups: tuple[tuple[int, int], ...] = ()  # (rows, uncompressed bytes) per row group


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


@dataclass(frozen=True)
class RowDefaults:
    """Sampling values for rows that do not carry their own (from options / pipeline file)."""

    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None


@dataclass(frozen=True)
class ParsedRow:
    """One input row: the request to run, or `error` (one line) when the row cannot run."""

    request: Request
    error: str | None = None


def filesystem(url: str, storage_options: dict | None = None) -> fsspec.AbstractFileSystem:
    fs, _ = fsspec.core.url_to_fs(url, **(storage_options or {}))
    return fs


def arrow_filesystem(fs: fsspec.AbstractFileSystem) -> PyFileSystem:
    return PyFileSystem(FSSpecHandler(fs))


def list_input(url: str, storage_options: dict | None = None) -> InputListing:
    """INPUT's Parquet files and their sizes, from a listing (no file is opened)."""
    opts = storage_options or {}
    try:
        fs, root = fsspec.core.url_to_fs(url, **opts)
        paths = _list_parquet(fs, root)
        sizes = [fs.size(p) for p in paths]
        base = (root if not _has_glob(root) and fs.isdir(root) else posixpath.dirname(paths[0])) if paths else ""
    except InputError:
        raise
    except Exception as exc:  # the backend's own error: unreachable bucket, bad credentials, ...
        raise InputError(f"cannot list input {url}: {one_line(exc)}") from exc
    if not paths:
        raise InputError(f"no Parquet files found at input {url}")
    return InputListing(url, tuple(zip(paths, sizes)), base)


def open_input(url: str | InputListing, storage_options: dict | None = None, shard_by: str | None = None) -> InputSource:
    """Resolve INPUT to its Parquet files and check their footers and columns (InputError if not)."""
    opts = storage_options or {}
    listing = url if isinstance(url, InputListing) else list_input(url, opts)
    fs = filesystem(listing.url, opts)
    files, schemas = [], []
    for path, size in listing.files:
        meta = _footer(fs, path)
        groups = tuple((meta.row_group(g).num_rows, meta.row_group(g).total_byte_size) for g in range(meta.num_row_groups))
        files.append(InputFile(path, posixpath.relpath(path, listing.base) if listing.base else path, size, meta.num_rows, groups))
        schemas.append(meta.schema.to_arrow_schema())
    schema = _unify(schemas, [fs.unstrip_protocol(p) for p, _ in listing.files])
    _check_columns(schema, listing.url, shard_by)
    return InputSource(listing.url, tuple(files), schema, tuple(sorted(opts.items())))


def _list_parquet(fs: fsspec.AbstractFileSystem, root: str) -> list[str]:
    if _has_glob(root):
        found = fs.glob(root)
    elif fs.isdir(root):
        found = fs.find(root)
    elif fs.exists(root):
        return [root]
    else:
        raise InputError(f"input {fs.unstrip_protocol(root)} does not exist")
    # Hidden and marker files (_SUCCESS, .crc, _metadata) are never data, as in Spark and Ray Data.
    return sorted(p for p in found if not posixpath.basename(p).startswith(("_", ".")) and not fs.isdir(p))


def _has_glob(path: str) -> bool:
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
    if not any(c in names for c in PROMPT_COLUMNS):
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
    try:
        with fs.open(f.path, "rb") as fh:
            pf = pq.ParquetFile(fh, pre_buffer=False)  # through a Python file, pre-buffering re-reads ranges
            present = [c for c in wanted if c in pf.schema_arrow.names]
            table = pf.read_row_groups(list(chunk.groups), columns=present)
    except Exception as exc:
        raise InputError(f"input file {fs.unstrip_protocol(f.path)} cannot be read: {one_line(exc)}") from exc
    if table.num_rows != chunk.rows:
        raise InputError(f"input file {fs.unstrip_protocol(f.path)} changed: row groups {list(chunk.groups)} hold {table.num_rows} rows, the footer said {chunk.rows}")
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
    return pc.coalesce(_as_strings(table.column("id").combine_chunks()), generated)


def key_strings(table: pa.Table, shard_by: str | None) -> pa.Array:
    """Each row's shard-by value as a string (null stays null); all null without shard_by."""
    if not shard_by:
        return pa.nulls(table.num_rows, pa.string())
    return _as_strings(table.column(shard_by).combine_chunks())


def _as_strings(col: pa.Array) -> pa.Array:
    """str() of each value, as Python prints it; strings and integers are converted by Arrow."""
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_integer(col.type):
        return col.cast(pa.string())
    return pa.array([None if v is None else str(v) for v in col.to_pylist()], pa.string())


# ---- the in-process key scan and row reads of `batchspec calibrate` (a sample, not a run) ------


@dataclass(frozen=True)
class RowKeys:
    """Per row, in input order: its file index, row index, id and shard key (no prompt text)."""

    file_index: list[int]
    row_index: list[int]
    ids: list[str]
    keys: list[str | None]


def scan_keys(source: InputSource, shard_by: str | None) -> RowKeys:
    """Ids and shard keys of every row, read with Ray Data (only those columns, input order)."""
    wanted = [c for c in ("id", shard_by) if c and c in source.schema.names]
    wanted = list(dict.fromkeys(wanted))
    per_file: list[dict[str, list]] = [{c: [] for c in wanted} for _ in source.files]
    if wanted:
        _ray_scan(source, wanted, per_file)
    file_index, row_index, ids, keys = [], [], [], []
    for i, f in enumerate(source.files):
        got = len(per_file[i][wanted[0]]) if wanted else f.rows
        if got != f.rows:
            raise InputError(f"input file {source.fs.unstrip_protocol(f.path)} yielded {got} rows, its footer says {f.rows}")
        for r in range(f.rows):
            file_index.append(i)
            row_index.append(r)
            ids.append(row_id(per_file[i]["id"][r] if "id" in wanted else None, f, r))
            key = per_file[i][shard_by][r] if shard_by else None
            keys.append(None if key is None else str(key))
    _refuse_duplicates(ids, source)
    return RowKeys(file_index, row_index, ids, keys)


def _ray_scan(source: InputSource, columns: list[str], per_file: list[dict[str, list]]) -> None:
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True  # input order is what makes generated ids stable
    index = {f.path: i for i, f in enumerate(source.files)}
    try:
        ds = ray.data.read_parquet(
            [f.path for f in source.files],
            filesystem=arrow_filesystem(source.fs),
            columns=columns,
            include_paths=True,
        )
        for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
            for path, group in _split_by_path(batch):
                i = index[_strip(path, source.files)]
                for c in columns:
                    per_file[i][c].extend(group.column(c).to_pylist())
    except Exception as exc:
        raise InputError(f"cannot read input {source.url}: {one_line(exc)}") from exc


def _split_by_path(batch: pa.Table):
    paths = batch.column("path").to_pylist()
    start = 0
    for end in range(1, len(paths) + 1):
        if end == len(paths) or paths[end] != paths[start]:
            yield paths[start], batch.slice(start, end - start)
            start = end


def _strip(path: str, files: tuple[InputFile, ...]) -> str:
    for f in files:
        if path == f.path or path.endswith("/" + f.path.lstrip("/")) or f.path.endswith(path.lstrip("/")):
            return f.path
    raise AssertionError(f"Ray Data returned a path outside the input: {path}")


def row_id(given, f: InputFile, row: int) -> str:
    """The row's `id` as a string, or `<file relative to INPUT>#<row index>` when it has none."""
    return str(given) if given is not None else f"{f.rel}#{row}"


def _refuse_duplicates(ids: list[str], source: InputSource) -> None:
    seen: set[str] = set()
    for i in ids:
        if i in seen:
            raise InputError(f"input {source.url} has duplicate id {i!r}; ids must be unique")
        seen.add(i)


# ---- reading a shard's rows back (inside a worker) ---------------------------------------------


def read_rows(source: InputSource, file_index: int, rows: list[int]) -> pa.Table:
    """The given rows (sorted row indices) of one input file, reading only the row groups needed."""
    f = source.files[file_index]
    fs = source.fs
    try:
        with fs.open(f.path, "rb") as fh:
            pf = pq.ParquetFile(fh)
            sizes = [pf.metadata.row_group(g).num_rows for g in range(pf.metadata.num_row_groups)]
            starts = [sum(sizes[:g]) for g in range(len(sizes))]
            groups = sorted({bisect.bisect_right(starts, r) - 1 for r in rows})
            table = pf.read_row_groups(groups)
    except Exception as exc:
        raise InputError(f"input file {fs.unstrip_protocol(f.path)} cannot be read: {one_line(exc)}") from exc
    # Position of each wanted row inside the concatenation of the row groups just read.
    base = {g: sum(sizes[h] for h in groups if h < g) for g in groups}
    take = []
    for r in rows:
        g = bisect.bisect_right(starts, r) - 1
        take.append(base[g] + r - starts[g])
    return table.take(pa.array(take, pa.int64())).cast(_with_nulls(table.schema, source.schema))


def _with_nulls(schema: pa.Schema, unified: pa.Schema) -> pa.Schema:
    """This file's columns, typed as in the unified schema (a null-typed column takes the real type)."""
    return pa.schema([unified.field(f.name) if f.name in unified.names else f for f in schema])


def parse_rows(table: pa.Table, ids: list[str], defaults: RowDefaults) -> list[ParsedRow]:
    """One ParsedRow per table row, in order; a row that cannot run gets a one-line error."""
    cols = {name: table.column(name).to_pylist() for name in table.column_names if name in CONSUMED_COLUMNS}
    return [_parse_row({c: v[i] for c, v in cols.items()}, ids[i], defaults) for i in range(table.num_rows)]


def _parse_row(row: dict, row_id: str, defaults: RowDefaults) -> ParsedRow:
    try:
        params = _sampling(row, row_id, defaults)
        prompt, messages = _prompt(row)
    except ValueError as exc:
        return ParsedRow(Request(row_id), str(exc))
    return ParsedRow(Request(row_id, prompt=prompt, messages=messages, params=params))


def _prompt(row: dict) -> tuple[str | None, tuple[dict[str, str], ...] | None]:
    prompt, messages = row.get("prompt"), row.get("messages")
    if prompt is not None:
        if not isinstance(prompt, str):
            raise ValueError(f"prompt must be a string, got {type(prompt).__name__}")
        if not prompt.strip():
            raise ValueError("prompt is empty")
        return prompt, None
    if messages is None:
        raise ValueError("prompt and messages are both null")
    if isinstance(messages, str):  # a JSON-encoded list is common in exported data
        try:
            messages = json.loads(messages)
        except json.JSONDecodeError:
            raise ValueError("messages is a string that is not a JSON list") from None
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {role, content}")
    out = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError("messages must be a list of {role: string, content: string}")
        out.append({"role": m["role"], "content": m["content"]})
    return None, tuple(out)


def _sampling(row: dict, row_id: str, d: RowDefaults) -> SamplingParams:
    max_tokens = _value(row, "max_tokens", d.max_tokens, int)
    temperature = _value(row, "temperature", d.temperature, float)
    top_p = _value(row, "top_p", d.top_p, float)
    seed = _value(row, "seed", None, int)
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if not temperature >= 0 or math.isinf(temperature):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if seed is None and d.seed is not None:
        # A per-row seed from the run seed and the id: the same row samples the same text whatever
        # shard or batch it lands in.
        seed = (d.seed * 1_000_003 + zlib.crc32(row_id.encode())) % (2**31)
    return SamplingParams(max_tokens, temperature, top_p, seed, _stop(row.get("stop")))


def _value(row: dict, name: str, default, kind: type):
    value = row.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        raise ValueError(f"{name} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    return kind(value)


def _stop(value) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(s for s in value if s)
    raise ValueError("stop must be a string or a list of strings")

