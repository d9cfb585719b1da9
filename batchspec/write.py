"""Step 4, commit: everything written under OUTPUT goes through `Output`, over fsspec only
(pipeline.py composes the manifest of step 5 and writes it through `Output.put_json`).

Layout (docs/architecture.md "Output layout", the contract with data teams):

    OUTPUT/outputs/<shard_id>.parquet   one row per input row of the shard
    OUTPUT/stats/<shard_id>.parquet     one row per shard: the shard's commit mark, written last
    OUTPUT/_plan.json  OUTPUT/_manifest.json  OUTPUT/_SUCCESS
    OUTPUT/_shards/<shard_id>.parquet  each shard's input rows, written once by batchspec.group
    OUTPUT/_failed/<shard_id>           a shard whose every attempt failed (its rows are error rows)
    OUTPUT/_lease/<n>.json              the lease of the run writing OUTPUT (batchspec.lease)
    OUTPUT/heads/<key>/                 train_head: each shard key's EAGLE-3 head, its training.json last (batchspec.heads)

Atomicity: every object is written whole in one call. Local files go to a temporary name in the
same folder and are renamed into place; object stores (s3://, gs://, memory://) get a single PUT,
which they publish atomically. A shard counts as committed once its stats object exists, so a
reader (or a resumed run) never takes half a shard for a whole one; names are deterministic, so a
retried shard overwrites rather than duplicates.

Schemas are explicit, derived from the records in stats.py (nullable strings, int64 counts), so
`pl.scan_parquet("OUTPUT/outputs/*.parquet")` reads every shard as one table.

Date templates: OUTPUT (and INPUT) may contain `{date}` (YYYY-MM-DD), `{yyyy}`, `{mm}`, `{dd}`, resolved
once at start from the run date (today in UTC, or `--run-date` to rerun a given night).
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import posixpath
import re
import uuid
from dataclasses import dataclass

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from batchspec.engine.base import Completion, SpecConfig
from batchspec.errors import ConfigError, OutputError, one_line
from batchspec.read import InputListing, has_glob, valid_strings
from batchspec import stats as records
from batchspec.stats import OUTPUT_FIELDS, OutputRow, ShardStats


def resolve_template(url: str, run_date: dt.date) -> str:
    """Fill `{date}`, `{yyyy}`, `{mm}`, `{dd}` in a path; any other `{...}` is a config error."""
    if "{" not in url:
        return url
    values = {"date": run_date.isoformat(), "yyyy": f"{run_date.year:04d}", "mm": f"{run_date.month:02d}", "dd": f"{run_date.day:02d}"}
    try:
        return url.format_map(values)
    except (KeyError, ValueError, IndexError) as exc:
        raise ConfigError(f"path {url!r}: unknown template field {exc}; expected {{date}}, {{yyyy}}, {{mm}} or {{dd}}") from exc


def output_schema(passthrough: pa.Schema) -> pa.Schema:
    return pa.schema([*OUTPUT_FIELDS, *passthrough])


def output_table(
    shard_id: str,
    completions: list[Completion],
    row_specs: list[SpecConfig],
    passthrough: pa.Table,
    schema: pa.Schema,
) -> pa.Table:
    """The shard's output rows in input order; one per completion, passthrough columns appended
    (their text as valid UTF-8, so every reader can open the file: `read.valid_strings`)."""
    assert len(completions) == len(row_specs) == passthrough.num_rows, (len(completions), len(row_specs), passthrough.num_rows)
    ours = records.table(OutputRow, [OutputRow.of(shard_id, c, s) for c, s in zip(completions, row_specs)])
    arrays = list(ours.columns)
    for f in list(schema)[len(OUTPUT_FIELDS) :]:
        have = f.name in passthrough.column_names
        column = passthrough.column(f.name).cast(f.type).combine_chunks() if have else pa.nulls(passthrough.num_rows, f.type)
        arrays.append(valid_strings(column) if pa.types.is_string(f.type) or pa.types.is_large_string(f.type) else column)
    return pa.Table.from_arrays(arrays, schema=schema)


def stats_table(row: ShardStats) -> pa.Table:
    """One stats row, typed by STATS_SCHEMA (derived from ShardStats: every field is a column)."""
    assert isinstance(row, ShardStats), type(row)
    return records.table(ShardStats, [row])


@dataclass(frozen=True)
class Output:
    """OUTPUT as an fsspec filesystem plus root; every write and listing of a run goes through here."""

    url: str
    storage_options: tuple[tuple[str, object], ...] = ()

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        fs, _ = fsspec.core.url_to_fs(self.url, **dict(self.storage_options))
        return fs

    @property
    def root(self) -> str:
        _, root = fsspec.core.url_to_fs(self.url, **dict(self.storage_options))
        return root.rstrip("/")

    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    def output_path(self, shard_id: str) -> str:
        return self.path("outputs", f"{shard_id}.parquet")

    def stats_path(self, shard_id: str) -> str:
        return self.path("stats", f"{shard_id}.parquet")

    def shard_input_path(self, shard_id: str) -> str:
        return self.path("_shards", f"{shard_id}.parquet")

    # -- writing ---------------------------------------------------------------------------------

    def put(self, path: str, data: bytes) -> None:
        """Write one whole object atomically (temp + rename locally, a single PUT elsewhere)."""
        self._write(path, data, exclusive=False)

    def create(self, path: str, data: bytes) -> bool:
        """Write one whole object only if nothing is at `path` (a conditional create); False when
        something is. Locally a temp file hard-linked into place (atomic, content included);
        elsewhere the store's exclusive create (S3: PUT with If-None-Match: *)."""
        try:
            self._write(path, data, exclusive=True)
            return True
        except FileExistsError:
            return False

    def _write(self, path: str, data: bytes, exclusive: bool) -> None:
        fs = self.fs
        try:
            if isinstance(fs, LocalFileSystem):
                os.makedirs(posixpath.dirname(path), exist_ok=True)
                tmp = posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.{uuid.uuid4().hex}.tmp")
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                if not exclusive:
                    os.replace(tmp, path)
                    return
                try:
                    os.link(tmp, path)  # fails when `path` exists: the conditional create
                finally:
                    os.unlink(tmp)
            elif exclusive:
                _create(fs, path, data)
            else:
                fs.pipe_file(path, data)
        except FileExistsError:
            raise
        except Exception as exc:
            raise OutputError(f"cannot write {fs.unstrip_protocol(path)}: {one_line(exc)}") from exc

    def exists(self, path: str) -> bool:
        fs = self.fs
        try:
            fs.invalidate_cache(path)
            return fs.exists(path)
        except Exception as exc:
            raise OutputError(f"cannot read OUTPUT {self.url}: {one_line(exc)}") from exc

    def names(self, folder: str) -> list[str]:
        """The names of the objects in OUTPUT/<folder> (none when it does not exist)."""
        fs = self.fs
        try:
            fs.invalidate_cache()
            return sorted(posixpath.basename(n.rstrip("/")) for n in fs.ls(self.path(folder), detail=False))
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise OutputError(f"cannot list OUTPUT {self.url}: {one_line(exc)}") from exc

    def remove_object(self, path: str) -> None:
        """Remove one object if it is there."""
        fs = self.fs
        try:
            fs.rm_file(path)
        except FileNotFoundError:
            pass
        except Exception as exc:
            raise OutputError(f"cannot remove {fs.unstrip_protocol(path)}: {one_line(exc)}") from exc

    def put_table(self, path: str, table: pa.Table) -> None:
        buf = io.BytesIO()
        pq.write_table(table, buf, compression="zstd")
        self.put(path, buf.getvalue())

    def commit_shard(self, shard_id: str, outputs: pa.Table, stats: pa.Table, failed: str | None = None,
                     was_failed: bool = False) -> None:
        """Outputs first, then stats: the stats object is the commit mark. A shard that failed every
        attempt (`failed`: why) is committed as error rows with a mark under _failed/ written
        before its stats, so a later run retries it; a retry that succeeds (`was_failed`) removes
        the mark after its stats."""
        self.put_table(self.output_path(shard_id), outputs)
        if failed is not None:
            self.put(self.failed_path(shard_id), failed.encode())
        self.put_table(self.stats_path(shard_id), stats)
        if failed is None and was_failed:
            self.remove_object(self.failed_path(shard_id))

    def failed_path(self, shard_id: str) -> str:
        return self.path("_failed", shard_id)

    def put_json(self, name: str, doc: dict) -> None:
        self.put(self.path(name), (json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n").encode())

    # -- reading and housekeeping --------------------------------------------------------------

    def read_text(self, name: str) -> str | None:
        fs = self.fs
        try:
            return fs.cat_file(self.path(name)).decode()
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise OutputError(f"cannot read OUTPUT {self.url}: {one_line(exc)}") from exc

    def committed(self) -> set[str]:
        """Shard ids whose stats object (the commit mark) exists."""
        return self._shard_files("stats")

    def shard_inputs(self) -> set[str]:
        """Shard ids whose input file exists under _shards/."""
        return self._shard_files("_shards")

    def failed(self) -> set[str]:
        """Shard ids committed as error rows after every attempt failed (retried by the next run)."""
        return {n for n in self.names("_failed") if not n.startswith(".")}

    def _shard_files(self, folder: str) -> set[str]:
        return {n[: -len(".parquet")] for n in self.names(folder) if n.endswith(".parquet") and not n.startswith(".")}

    def read_stats(self, shard_ids: list[str]) -> list[ShardStats]:
        """The committed shards' stats rows; OutputError (one line naming the file) for one that
        cannot be read: written whole in one call, it was damaged after its commit."""
        fs = self.fs
        rows = []
        for sid in shard_ids:
            path = self.stats_path(sid)
            try:
                table = pq.read_table(pa.BufferReader(fs.cat_file(path)))
            except Exception as exc:
                shown = fs.unstrip_protocol(path) if "://" in self.url else path
                raise OutputError(f"OUTPUT {self.url}: the commit mark {shown} cannot be read (Parquet: {one_line(exc)}); "
                                  "delete it to run that shard again") from None
            rows.extend(ShardStats.from_row(r) for r in table.to_pylist())
        return rows

    def clear(self) -> None:
        """Remove a previous run's files (for --no-resume); other files under OUTPUT are left alone."""
        self._remove("_SUCCESS", "_manifest.json", "_plan.json", "outputs", "stats", "_shards", "_failed", "heads")

    def clear_shard_inputs(self) -> None:
        """Remove _shards/: a grouping that stopped before its _plan.json was written, or a complete run
        after its _SUCCESS (unless keep_shards; see batchspec.pipeline)."""
        self._remove("_shards")

    def _remove(self, *names: str) -> None:
        fs = self.fs
        for name in names:
            p = self.path(name)
            try:
                if fs.exists(p):
                    fs.rm(p, recursive=True)
            except Exception as exc:
                raise OutputError(f"cannot clear {fs.unstrip_protocol(p)}: {one_line(exc)}") from exc
        fs.invalidate_cache()

    def check_writable(self) -> None:
        """Fail before any work when OUTPUT cannot be written (missing bucket, no permission)."""
        fs = self.fs
        try:
            if isinstance(fs, LocalFileSystem):
                os.makedirs(self.root, exist_ok=True)
            probe = self.path(f"_write_check.{uuid.uuid4().hex}")
            fs.pipe_file(probe, b"")
            fs.rm(probe)
        except Exception as exc:
            raise OutputError(f"cannot write OUTPUT {self.url}: {one_line(exc)}") from exc



def _create(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """The store's exclusive create (`mode="create"`: S3's If-None-Match, the memory store's
    check under its lock). A backend whose pipe_file takes no mode gets a look first, then a
    write: not atomic, so two runs starting within a request of each other could both take it."""
    try:
        fs.pipe_file(path, data, mode="create")
    except (TypeError, NotImplementedError):
        if fs.exists(path):
            raise FileExistsError(path) from None
        fs.pipe_file(path, data)


def check_apart(listing: InputListing, storage_options: dict, output: Output) -> None:
    """OutputError (one line) when INPUT and OUTPUT overlap: an OUTPUT inside an INPUT folder (or
    one an INPUT glob would match files under) makes the next listing take the run's own outputs
    as input, and an INPUT inside OUTPUT is deleted by --no-resume."""
    in_fs, in_root = fsspec.core.url_to_fs(listing.url, **storage_options)
    out_fs = output.fs
    if _protocol(in_fs) != _protocol(out_fs):
        return
    local = isinstance(out_fs, LocalFileSystem)
    norm = (lambda p: os.path.realpath(p)) if local else (lambda p: p.rstrip("/"))
    out_root = norm(output.root)
    inside = next((p for p, _ in listing.files if _within(norm(p), out_root)), None)
    if has_glob(in_root):
        pattern = re.compile(fsspec.utils.glob_translate(os.path.abspath(in_root) if local else in_root.rstrip("/")))
        overlap = inside or any(pattern.match(f"{out_root}/{d}/x.parquet") for d in ("outputs", "stats", "_shards"))
    else:
        root = norm(in_root)
        overlap = inside or _within(out_root, root) or _within(root, out_root)
    if overlap:
        raise OutputError(f"INPUT {listing.url} and OUTPUT {output.url} overlap: a run would read its own files as input "
                          "(and --no-resume would delete input); use an OUTPUT outside INPUT")


def _protocol(fs: fsspec.AbstractFileSystem) -> str:
    protocol = fs.protocol
    return protocol if isinstance(protocol, str) else protocol[0]


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")
