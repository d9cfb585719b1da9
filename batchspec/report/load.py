"""`batchspec report`: what a finished (or half-finished) run did, read back from OUTPUT alone.

This module owns reading a run's outputs and stats with polars from any fsspec URL, the numbers
a report shows (a `RunReport` of `ShardReport`s and `Totals`), the self-contained HTML page (html.py)
and its plots (plots.py) are built from them. It knows nothing about how the run was made; it trusts only the files of
DESIGN.md "Output layout". The CLI prints the table (batchspec/cli/report.py).

Definitions (per shard, from its stats row; totals over every committed shard):

    speedup            the stats' speedup: chosen arm vs "none", both measured in the shard's calibration;
                       totals: sum(decode_s x speedup) / sum(decode_s), as `batchspec run` prints it
    calibration share  calibration_s / wall_s (all calibration time, rows it kept as outputs included)
    calibration cost   calibration_overhead_s / wall_s (the calibration work not kept as output)
    time split         prefill_s, draft_s, verify_s, calibration_s, and other = the rest of wall_s
                       (the decode loop's own bookkeeping, tokenizing, writing)
    acceptance (total) sum(accepted_tokens) / sum(draft_tokens) over the output rows of shards that drafted
    mean accepted len  (total) 1 + sum(accepted_tokens) / sum(target_steps), over the same rows

Storage: local paths and the object stores polars reads natively (s3, gs, az) are scanned lazily
by polars, so only the columns the report needs are fetched; any other fsspec URL (memory://, ...)
is read through fsspec. For s3 the credentials, region and endpoint come from the usual AWS_*
variables, AWS_ENDPOINT_URL included (an http:// endpoint allows plain HTTP).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import fsspec
import polars as pl

from batchspec.errors import OutputError, one_line

POLARS_PROTOCOLS = ("file", "local", "s3", "s3a", "gs", "gcs", "az", "abfs", "abfss")
OUTPUT_COLUMNS = ("shard_id", "finish_reason", "output_tokens", "draft_tokens", "accepted_tokens", "target_steps")
TIME_PARTS = ("prefill", "draft", "verify", "other", "calibration")
MAX_PLOTTED = 60  # shards per bar chart; past it, a scatter per shard and time per shard key
MAX_ARM_PANELS = 24


@dataclass(frozen=True)
class Arm:
    label: str
    spec_method: str
    draft_len: int
    tokens_per_s: float | None
    acceptance_rate: float | None
    mean_accepted_len: float | None
    chosen: bool
    predicted_tokens_per_s: float | None = None  # calibration's prediction for an arm it did not measure
    speedup: float | None = None  # over "none" on the same calibration rows


@dataclass(frozen=True)
class ShardReport:
    shard_id: str
    shard_key: str | None
    rows: int
    error_rows: int
    output_rows: int | None  # rows found in outputs/ (None when outputs were not read)
    spec_method: str
    draft_len: int
    acceptance_rate: float | None
    mean_accepted_len: float | None
    output_tokens: int
    tokens_per_s: float | None
    baseline_tokens_per_s: float | None
    speedup: float | None
    calibration_share: float | None
    calibration_cost: float | None
    wall_s: float
    decode_s: float
    time_split: dict[str, float]  # TIME_PARTS -> seconds, summing to wall_s
    arms: tuple[Arm, ...]
    decision: str | None = None  # calibrated | reused | fixed | too_small (batchspec.shard)
    decision_reason: str | None = None
    drift_fallback_row: int | None = None  # row where the shard fell back to "none", if it did
    note: str | None = None
    speculation_unmeasured: str | None = None  # why no speculative arm could be measured, if none could
    builds: int = 0  # engine builds while the shard ran (TensorRT-LLM)


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
    calibration_share: float | None
    calibration_cost: float | None
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

    def to_doc(self) -> dict:
        return asdict(self)


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


def load_report(url: str, environ: dict[str, str] | None = None) -> RunReport:
    """Read OUTPUT's plan, manifest, stats and outputs into a RunReport (OutputError if not a run)."""
    from batchspec.write import Output

    url = url.rstrip("/")
    fs_opts, pl_opts = storage_options(url, environ)
    out = Output(url, tuple(fs_opts.items()))
    plan_text = out.read_text("_plan.json")
    manifest = json.loads(out.read_text("_manifest.json") or "{}")
    complete = out.read_text("_SUCCESS") is not None
    stats_files = _parquet_files(out, "stats")
    if not stats_files:
        if plan_text is None:
            raise OutputError(f"OUTPUT {url}: not a batchspec run (no _plan.json and no stats/*.parquet)")
        raise OutputError(f"OUTPUT {url}: planned, but no shard is committed yet (stats/ is empty)")
    planned = len(json.loads(plan_text).get("shards", [])) if plan_text else None
    stats = _read(out, stats_files, pl_opts, None).sort("shard_id")
    output_files = _parquet_files(out, "outputs")
    per_shard, reasons = _output_aggregates(out, output_files, pl_opts) if output_files else (None, {})
    shards = tuple(_shard(row, per_shard) for row in stats.to_dicts())
    warnings = _warnings(url, shards, planned, complete, per_shard)
    config = manifest.get("config", {})
    engine = config.get("engine") or _first(stats, "engine")
    model = config.get("model") or _first(stats, "model")
    return RunReport(url, complete, engine, model, manifest.get("input"), shards,
                     _totals(shards, planned, per_shard, reasons), tuple(warnings))


def _parquet_files(out, folder: str) -> list[str]:
    fs = out.fs
    try:
        names = fs.ls(out.path(folder), detail=False)
    except FileNotFoundError:
        return []
    except Exception as exc:
        raise OutputError(f"cannot list {out.url}/{folder}: {one_line(exc)}") from exc
    keep = [n for n in names if n.endswith(".parquet") and not n.rsplit("/", 1)[-1].startswith(".")]
    return sorted(fs.unstrip_protocol(n) if "://" in out.url else n for n in keep)


def _read(out, files: list[str], pl_opts: dict | None, columns: list[str] | None) -> pl.DataFrame:
    try:
        if fsspec.utils.get_protocol(out.url) in POLARS_PROTOCOLS:
            frame = pl.scan_parquet(files, storage_options=pl_opts)
            return (frame.select(columns) if columns else frame).collect()
        parts = []
        for f in files:
            with out.fs.open(f, "rb") as handle:
                parts.append(pl.read_parquet(handle, columns=columns))
        return pl.concat(parts, how="diagonal_relaxed")
    except Exception as exc:
        raise OutputError(f"cannot read {files[0].rsplit('/', 2)[0]}: {one_line(exc)}") from exc


def _output_aggregates(out, files: list[str], pl_opts: dict | None) -> tuple[dict[str, dict], dict[str, int]]:
    frame = _read(out, files, pl_opts, list(OUTPUT_COLUMNS))
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
    wall = float(row.get("wall_s") or 0.0)
    parts = {name: float(row.get(f"{name}_s") or 0.0) for name in ("prefill", "draft", "verify", "calibration")}
    parts["other"] = max(0.0, wall - sum(parts.values()))
    base, tps = row.get("baseline_tokens_per_s"), row.get("tokens_per_s")
    speedup = row.get("speedup")
    method, k = row.get("spec_method") or "none", int(row.get("draft_len") or 0)
    arms = tuple(_arm(c, method, k) for c in row.get("candidates") or [])
    found = per_shard.get(row["shard_id"]) if per_shard is not None else None
    return ShardReport(
        shard_id=row["shard_id"], shard_key=row.get("shard_key"), rows=int(row.get("rows") or 0),
        error_rows=int(row.get("error_rows") or 0),
        output_rows=None if per_shard is None else (found["rows"] if found else 0),
        spec_method=method, draft_len=k, acceptance_rate=row.get("acceptance_rate"),
        mean_accepted_len=row.get("mean_accepted_len"), output_tokens=int(row.get("output_tokens") or 0),
        tokens_per_s=tps, baseline_tokens_per_s=base, speedup=speedup,
        calibration_share=parts["calibration"] / wall if wall > 0 else None,
        calibration_cost=_cost(row) / wall if wall > 0 else None, wall_s=wall,
        decode_s=float(row.get("decode_s") or 0.0), time_split={p: parts[p] for p in TIME_PARTS},
        arms=arms, decision=row.get("decision_source"), decision_reason=row.get("decision_reason"),
        drift_fallback_row=row.get("drift_fallback_row"), note=row.get("note"),
        speculation_unmeasured=row.get("speculation_unmeasured"), builds=int(row.get("builds") or 0),
    )


def _arm(c: dict, method: str, k: int) -> Arm:
    m, dl = c.get("spec_method") or c.get("method") or "none", int(c.get("draft_len") or 0)
    chosen = m == method and (m == "none" or dl == k)
    return Arm(c.get("label") or (m if m == "none" else f"{m}:k={dl}"), m, dl, c.get("tokens_per_s"),
               c.get("acceptance_rate"), c.get("mean_accepted_len"), chosen, c.get("predicted_tokens_per_s"),
               c.get("speedup"))


def _cost(row: dict) -> float:
    """Calibration time not kept as output; stats written before that column count it all."""
    overhead = row.get("calibration_overhead_s")
    return float(row.get("calibration_s") or 0.0) if overhead is None else float(overhead)


def _totals(shards: tuple[ShardReport, ...], planned: int | None, per_shard: dict | None, reasons: dict) -> Totals:
    timed = [s for s in shards if s.speedup and s.decode_s and s.tokens_per_s]
    # tokens committed within each shard's timed decode (rows kept from calibration were timed there)
    decoded = {s.shard_id: s.tokens_per_s * s.decode_s for s in shards if s.tokens_per_s and s.decode_s}
    base_s = sum(s.decode_s * s.speedup for s in timed)  # what plain decoding would have taken
    timed_decode = sum(s.decode_s for s in timed)
    decode = sum(s.decode_s for s in shards)
    wall = sum(s.wall_s for s in shards)
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
        tokens_per_s=sum(decoded.values()) / decode if decode else None,
        baseline_tokens_per_s=sum(decoded[s.shard_id] for s in timed) / base_s if base_s else None,
        speedup=base_s / timed_decode if timed_decode else None,
        calibration_share=split["calibration"] / wall if wall else None,
        calibration_cost=sum((s.calibration_cost or 0.0) * s.wall_s for s in shards) / wall if wall else None,
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
