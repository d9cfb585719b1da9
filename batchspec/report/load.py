"""`batchspec report`: what a finished (or half-finished) run did, read back from OUTPUT alone.

This module owns reading a run's outputs and stats with polars from any fsspec URL, the numbers
a report shows (a `RunReport` of `ShardReport`s and `Totals`), the self-contained HTML page
(html.py) and its plots (plots.py) are built from them, and each shard's calibration events. It
knows nothing about how the run was made; it trusts only the files of the output layout
(docs/architecture.md "Output layout"). The CLI prints the table (batchspec/cli/report.py).

Definitions (per shard, from its stats row; totals over every committed shard):

    speedup            the stats' speedup: the shard's goodput over plain decoding's price for the same
                       tokens (the worker's cost table); totals: sum(decode_s x speedup) / sum(decode_s),
                       as `batchspec run` prints it (one function for both: batchspec.stats.speedup_total)
    calibration share  calibration_s / wall_s: the controller's own seconds (counterfactual acceptance,
                       decisions) and the builds it caused, none of it output; the rows it measured arms
                       on are output, timed in decode
    time split         prefill_s, draft_s, verify_s, calibration_s, and other = the rest of wall_s
                       (the decode loop's own bookkeeping, tokenizing, writing)
    acceptance (total) sum(accepted_tokens) / sum(draft_tokens) over the output rows of shards that drafted
    mean accepted len  (total) 1 + sum(accepted_tokens) / sum(target_steps), over the same rows
    GPU-hours          used and saved against plain decoding, per shard key and for the run (savings.py)

Storage: local paths and the object stores polars reads natively (s3, gs, az) are scanned lazily
by polars, so only the columns the report needs are fetched; any other fsspec URL (memory://, ...)
is read through fsspec. For s3 the credentials, region and endpoint come from the usual AWS_*
variables, AWS_ENDPOINT_URL included (an http:// endpoint allows plain HTTP).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import fsspec
import polars as pl

from batchspec.errors import OutputError, one_line
from batchspec.redact import redact_strings, redact_text
from batchspec.report.savings import Savings, savings
from batchspec.stats import ShardStats, speedup_total, to_columns

POLARS_PROTOCOLS = ("file", "local", "s3", "s3a", "gs", "gcs", "az", "abfs", "abfss")
OUTPUT_COLUMNS = ("shard_id", "finish_reason", "output_tokens", "draft_tokens", "accepted_tokens", "target_steps")
TIME_PARTS = ("prefill", "draft", "verify", "other", "calibration")
MAX_PLOTTED = 60  # shards per bar chart; past it, a scatter per shard and time per shard key
MAX_ARM_PANELS = 24


@dataclass(kw_only=True)
class ShardReport(ShardStats):
    """A shard's stats row (every column of OUTPUT/stats, as batchspec.stats.ShardStats declares
    them) and what the report derives from it. `candidates` are the calibrated arms; `chosen` is
    the one the shard ran with (batchspec.stats.chosen_arm)."""

    output_rows: int | None = None  # rows found in outputs/ (None when outputs were not read)
    calibration_share: float | None = None
    time_split: dict[str, float] = field(default_factory=dict)  # TIME_PARTS -> seconds, summing to wall_s


@dataclass(frozen=True)
class Totals:
    shards: int
    planned_shards: int | None
    rows: int
    error_rows: int
    output_rows: int | None
    output_tokens: int
    acceptance_rate: float | None
    mean_accepted_len: float | None
    tokens_per_s: float | None  # tokens committed in decode / decode seconds, over all shards
    baseline_tokens_per_s: float | None
    speedup: float | None
    speedup_predicted_share: float  # share of the decode time behind `speedup` priced by prediction
    calibration_share: float | None
    wall_s: float  # summed over shards (workers run in parallel)
    time_split: dict[str, float]
    finish_reasons: dict[str, int]


@dataclass(frozen=True)
class RunReport:
    output: str
    complete: bool  # _SUCCESS exists
    engine: str | None
    model: str | None
    input: str | None
    shards: tuple[ShardReport, ...]
    totals: Totals
    warnings: tuple[str, ...] = field(default_factory=tuple)
    savings: Savings | None = None  # GPU-hours (CPU-hours) used and saved, per key and for the run

    def to_doc(self) -> dict:
        """The report as JSON-ready values: each shard's stats columns (arm labels included), the
        label of its chosen arm, and what the report derives; no URL with its secrets."""
        shards = [{**to_columns(s), "chosen": s.chosen.label if s.chosen else None} for s in self.shards]
        return redact_strings({**asdict(self), "shards": shards})


# ---------------------------------------------------------------------------------------------
# Reading


def storage_options(url: str, environ: dict[str, str] | None = None) -> tuple[dict[str, Any], dict[str, str] | None]:
    """(fsspec options, polars options) for URL from the environment; polars' None = its defaults."""
    environ = os.environ if environ is None else environ
    if fsspec.utils.get_protocol(url) not in ("s3", "s3a"):
        return {}, None
    endpoint = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
    fs_opts: dict[str, Any] = {"client_kwargs": {"endpoint_url": endpoint}} if endpoint else {}
    names = {"AWS_ACCESS_KEY_ID": "aws_access_key_id", "AWS_SECRET_ACCESS_KEY": "aws_secret_access_key",
             "AWS_SESSION_TOKEN": "aws_session_token", "AWS_DEFAULT_REGION": "aws_region", "AWS_REGION": "aws_region"}
    pl_opts = {opt: environ[var] for var, opt in names.items() if environ.get(var)}
    if endpoint:
        pl_opts["aws_endpoint_url"] = endpoint
        if endpoint.startswith("http://"):
            pl_opts["aws_allow_http"] = "true"
    return fs_opts, pl_opts


def load_report(url: str, environ: dict[str, str] | None = None, gpu_hour_price: float | None = None) -> RunReport:
    """Read OUTPUT's plan, manifest, stats and outputs into a RunReport (OutputError if not a run);
    `gpu_hour_price` prices its device-hours (savings.py)."""
    from batchspec.write import Output

    url = url.rstrip("/")
    fs_opts, pl_opts = storage_options(url, environ)
    out = Output(url, tuple(fs_opts.items()))
    plan_text = out.read_text("_plan.json")
    manifest = json.loads(out.read_text("_manifest.json") or "{}")
    complete = out.read_text("_SUCCESS") is not None
    stats_files = parquet_files(out, "stats")
    if not stats_files:
        if plan_text is None:
            raise OutputError(f"OUTPUT {url}: not a batchspec run (no _plan.json and no stats/*.parquet)")
        raise OutputError(f"OUTPUT {url}: planned, but no shard is committed yet (stats/ is empty)")
    planned = len(json.loads(plan_text).get("shards", [])) if plan_text else None
    stats = read_frame(out, stats_files, pl_opts, None).sort("shard_id")
    output_files = parquet_files(out, "outputs")
    per_shard, reasons = _output_aggregates(out, output_files, pl_opts) if output_files else (None, {})
    shards = tuple(_shard(row, per_shard) for row in stats.to_dicts())
    warnings = _warnings(url, shards, planned, complete, per_shard)
    config = manifest.get("config", {})
    engine = config.get("engine") or _first(stats, "engine")
    model = config.get("model") or _first(stats, "model")
    # What the report shows never carries a URL's secrets, whatever wrote the files (batchspec.redact).
    return RunReport(redact_text(url), complete, engine, redact_strings(model), redact_strings(manifest.get("input")),
                     tuple(_shown(s) for s in shards), _totals(shards, planned, per_shard, reasons),
                     tuple(redact_text(w) for w in warnings), savings(shards, gpu_hour_price))


def _shown(shard: ShardReport) -> ShardReport:
    return replace(shard, **{name: redact_text(getattr(shard, name)) for name in ("model", "draft_model", "note") if getattr(shard, name)})


def parquet_files(out, folder: str) -> list[str]:
    """The Parquet objects of OUTPUT/<folder>, sorted (hidden names, a writer's temporaries, left out)."""
    fs = out.fs
    try:
        names = fs.ls(out.path(folder), detail=False)
    except FileNotFoundError:
        return []
    except Exception as exc:
        raise OutputError(f"cannot list {out.url}/{folder}: {one_line(exc)}") from exc
    keep = [n for n in names if n.endswith(".parquet") and not n.rsplit("/", 1)[-1].startswith(".")]
    return sorted(fs.unstrip_protocol(n) if "://" in out.url else n for n in keep)


def read_frame(out, files: list[str], pl_opts: dict | None, columns: list[str] | None) -> pl.DataFrame:
    """`files` as one frame (`columns` only, or all), through polars' own readers where it has them."""
    try:
        if fsspec.utils.get_protocol(out.url) in POLARS_PROTOCOLS:
            frame = pl.scan_parquet(files, storage_options=pl_opts, glob=False)  # listed files: a "[" in a path is not a pattern
            return (frame.select(columns) if columns else frame).collect()
        parts = []
        for f in files:
            with out.fs.open(f, "rb") as handle:
                parts.append(pl.read_parquet(handle, columns=columns))
        return pl.concat(parts, how="diagonal_relaxed")
    except Exception as exc:
        raise OutputError(f"cannot read {files[0].rsplit('/', 2)[0]}: {one_line(exc)}") from exc


def _output_aggregates(out, files: list[str], pl_opts: dict | None) -> tuple[dict[str, dict], dict[str, int]]:
    frame = read_frame(out, files, pl_opts, list(OUTPUT_COLUMNS))
    per_shard = frame.group_by("shard_id").agg(
        pl.len().alias("rows"),
        (pl.col("finish_reason") == "error").sum().alias("errors"),
        pl.col("output_tokens").sum(),
        pl.col("draft_tokens").sum(),
        pl.col("accepted_tokens").sum(),
        pl.col("target_steps").sum(),
    )
    reasons = frame.group_by("finish_reason").len().sort("finish_reason")
    return ({r["shard_id"]: r for r in per_shard.to_dicts()},
            {str(r["finish_reason"]): int(r["len"]) for r in reasons.to_dicts()})


def _first(frame: pl.DataFrame, column: str) -> str | None:
    return frame[column][0] if column in frame.columns and frame.height else None


# ---------------------------------------------------------------------------------------------
# The numbers


def _shard(row: dict, per_shard: dict[str, dict] | None) -> ShardReport:
    stats = ShardStats.from_row(row)
    wall = stats.wall_s or 0.0
    parts = {"prefill": stats.prefill_s, "draft": stats.draft_s, "verify": stats.verify_s, "calibration": stats.calibration_s}
    parts = {name: v or 0.0 for name, v in parts.items()}
    parts["other"] = max(0.0, wall - sum(parts.values()))
    found = per_shard.get(stats.shard_id) if per_shard is not None else None
    return ShardReport(
        **{f.name: getattr(stats, f.name) for f in fields(ShardStats)},
        output_rows=None if per_shard is None else (found["rows"] if found else 0),
        calibration_share=parts["calibration"] / wall if wall > 0 else None,
        time_split={p: parts[p] for p in TIME_PARTS},
    )


def _totals(shards: tuple[ShardReport, ...], planned: int | None, per_shard: dict | None, reasons: dict) -> Totals:
    # tokens committed within each shard's timed decode (rows kept from calibration were timed there)
    decoded = sum(s.tokens_per_s * s.decode_s for s in shards if s.tokens_per_s and s.decode_s)
    decode = sum(s.decode_s or 0.0 for s in shards)
    total = speedup_total(shards)
    wall = sum(s.wall_s or 0.0 for s in shards)
    tokens = sum(s.output_tokens for s in shards)
    split = {p: sum(s.time_split[p] for s in shards) for p in TIME_PARTS}
    speculated = [r for r in (per_shard or {}).values() if r["draft_tokens"]]
    drafted = sum(r["draft_tokens"] for r in speculated)
    accepted = sum(r["accepted_tokens"] or 0 for r in speculated)
    steps = sum(r["target_steps"] or 0 for r in speculated)
    return Totals(
        shards=len(shards), planned_shards=planned, rows=sum(s.rows for s in shards),
        error_rows=sum(s.error_rows for s in shards),
        output_rows=sum(r["rows"] for r in per_shard.values()) if per_shard is not None else None,
        output_tokens=tokens, acceptance_rate=accepted / drafted if drafted else None,
        mean_accepted_len=1 + accepted / steps if steps else None,
        tokens_per_s=decoded / decode if decode else None,
        baseline_tokens_per_s=total.baseline_tokens_per_s,
        speedup=total.speedup,
        speedup_predicted_share=total.predicted_share,
        calibration_share=split["calibration"] / wall if wall else None,
        wall_s=wall, time_split=split,
        finish_reasons=reasons,
    )


def _warnings(url: str, shards, planned: int | None, complete: bool, per_shard: dict | None) -> list[str]:
    out = []
    unmeasured = [s for s in shards if s.speculation_unmeasured]
    if unmeasured:
        first = unmeasured[0]
        out.append(f"speculation could not be measured in {len(unmeasured)} of {len(shards)} shard(s); they ran without "
                   f"speculation (first {first.shard_id}: {first.speculation_unmeasured})")
    if not complete:
        done = f"{len(shards)} of {planned}" if planned is not None else str(len(shards))
        out.append(f"run not finished: no _SUCCESS; {done} shards committed (rerun `batchspec run` to resume)")
    if per_shard is None:
        out.append("no outputs/*.parquet found; row counts come from stats alone")
    else:
        off = [s.shard_id for s in shards if s.output_rows != s.rows]
        if off:
            out.append(f"{len(off)} shard(s) whose outputs row count differs from stats (first {off[0]})")
        orphans = sorted(set(per_shard) - {s.shard_id for s in shards})
        if orphans:
            out.append(f"outputs/ holds rows of {len(orphans)} uncommitted shard(s) (first {orphans[0]}); a resumed run rewrites them")
    return out


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0%}"


def _num(v: float | None, digits: int = 1) -> str:
    return "n/a" if v is None else f"{v:,.{digits}f}"


def _x(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}x"
