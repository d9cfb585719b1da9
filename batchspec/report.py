"""`batchspec report`: what a finished (or half-finished) run did, read back from OUTPUT alone.

This module owns reading a run's outputs and stats with polars from any fsspec URL, the numbers
a report shows (a `RunReport` of `ShardReport`s and `Totals`), and the self-contained HTML page
with its plots. It knows nothing about how the run was made; it trusts only the files of
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

import base64
import html
import io
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import fsspec
import polars as pl

from batchspec.errors import OutputError

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
    decision: str | None = None  # calibrated | reused | fixed | too_small (batchspec.generate)
    decision_reason: str | None = None
    drift_fallback_row: int | None = None  # row where the shard fell back to "none", if it did
    note: str | None = None


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
        raise OutputError(f"cannot list {out.url}/{folder}: {' '.join(str(exc).split())[:300]}") from exc
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
        raise OutputError(f"cannot read {files[0].rsplit('/', 2)[0]}: {' '.join(str(exc).split())[:300]}") from exc


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


# ---------------------------------------------------------------------------------------------
# The HTML page


def render_html(report: RunReport) -> str:
    """A self-contained page: summary, plots as inline PNGs, and the per-shard table."""
    import matplotlib

    matplotlib.use("Agg")
    figures = [
        ("Acceptance and speedup per shard", _fig_rates(report)),
        ("Calibrated arms per shard (tokens/s; the chosen arm is highlighted)", _fig_arms(report)),
        ("Where the time went", _fig_time(report)),
    ]
    t = report.totals
    cards = [
        ("rows", f"{t.rows:,}", f"{t.error_rows} with errors"),
        ("shards", f"{t.shards}" + (f" / {t.planned_shards}" if t.planned_shards is not None else ""), "complete" if report.complete else "NOT finished"),
        ("speedup vs none", _x(t.speedup), f"baseline {_num(t.baseline_tokens_per_s)} tok/s"),
        ("acceptance rate", _pct(t.acceptance_rate), f"mean accepted len {_num(t.mean_accepted_len, 2)}"),
        ("decode tokens/s", _num(t.tokens_per_s), f"{t.output_tokens:,} output tokens"),
        ("calibration share", _pct(t.calibration_share), f"of {t.wall_s:.1f} shard-seconds; cost {_pct(t.calibration_cost)} (not kept as output)"),
    ]
    card_html = "".join(f'<div class="card"><div class="k">{html.escape(k)}</div><div class="v">{html.escape(v)}</div>'
                        f'<div class="s">{html.escape(s)}</div></div>' for k, v, s in cards)
    fig_html = "".join(f'<section><h2>{html.escape(title)}</h2><img alt="{html.escape(title)}" src="data:image/png;base64,{png}"></section>'
                       for title, png in figures if png)
    warn_html = "".join(f'<p class="warn">{html.escape(w)}</p>' for w in report.warnings)
    sub = " · ".join(html.escape(str(x)) for x in (report.engine, report.model, report.input) if x)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>batchspec report: {html.escape(report.output)}</title>
<style>
body{{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px auto;max-width:1180px;color:#1f2933;padding:0 16px}}
h1{{font-size:22px;margin:0}} h2{{font-size:16px;margin:28px 0 8px}} .sub{{color:#52606d;margin:4px 0 16px}}
.cards{{display:grid;grid-template-columns:repeat(6,1fr);gap:10px}}
.card{{background:#f5f7fa;border-radius:8px;padding:10px 12px}} .k{{color:#52606d;font-size:12px}}
.v{{font-size:22px;font-weight:600}} .s{{color:#7b8794;font-size:12px}}
img{{max-width:100%;border:1px solid #e4e7eb;border-radius:6px}}
table{{border-collapse:collapse;font-size:12px;width:100%}} th,td{{padding:4px 6px;border-bottom:1px solid #e4e7eb;text-align:right}}
th:first-child,td:first-child,th:nth-child(2),td:nth-child(2){{text-align:left}} tfoot td{{font-weight:600}}
.warn{{background:#fff3c4;padding:6px 10px;border-radius:6px}}
</style></head><body>
<h1>batchspec report: {html.escape(report.output)}</h1><div class="sub">{sub}</div>
{warn_html}<div class="cards">{card_html}</div>
{fig_html}
<section><h2>Per shard</h2>{_html_table(report)}</section>
</body></html>
"""


def table_rows(report: RunReport) -> tuple[list[str], list[list[str]], list[str]]:
    """Header, one row per shard, and the totals row: shared by the terminal and the HTML table."""
    header = ["shard", "key", "rows", "errors", "method", "k", "decision", "accept", "mean acc len", "tok/s", "baseline tok/s", "speedup", "calib share", "calib cost"]
    rows = [[s.shard_id, s.shard_key or "-", str(s.rows), str(s.error_rows), s.spec_method, str(s.draft_len) if s.spec_method != "none" else "-",
             (s.decision or "-") + (f" (drift@{s.drift_fallback_row})" if s.drift_fallback_row is not None else ""),
             _pct(s.acceptance_rate), _num(s.mean_accepted_len, 2), _num(s.tokens_per_s), _num(s.baseline_tokens_per_s), _x(s.speedup),
             _pct(s.calibration_share), _pct(s.calibration_cost)] for s in report.shards]
    t = report.totals
    total = ["total", f"{t.shards} shards", str(t.rows), str(t.error_rows), "", "", "", _pct(t.acceptance_rate), _num(t.mean_accepted_len, 2),
             _num(t.tokens_per_s), _num(t.baseline_tokens_per_s), _x(t.speedup), _pct(t.calibration_share), _pct(t.calibration_cost)]
    return header, rows, total


def _html_table(report: RunReport) -> str:
    header, rows, total = table_rows(report)
    cell = lambda tag, xs: "<tr>" + "".join(f"<{tag}>{html.escape(x)}</{tag}>" for x in xs) + "</tr>"  # noqa: E731
    body = "".join(cell("td", r) for r in rows)
    return f"<table><thead>{cell('th', header)}</thead><tbody>{body}</tbody><tfoot>{cell('td', total)}</tfoot></table>"


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _time_groups(report: RunReport) -> tuple[list[tuple[str, dict[str, float]]], str]:
    """Per shard; or, past MAX_PLOTTED shards, per shard key (the MAX_PLOTTED longest keys)."""
    if len(report.shards) <= MAX_PLOTTED:
        return [(s.shard_id, s.time_split) for s in report.shards], "time per shard"
    keys: dict[str, dict[str, float]] = {}
    for s in report.shards:
        split = keys.setdefault(str(s.shard_key), dict.fromkeys(TIME_PARTS, 0.0))
        for part in TIME_PARTS:
            split[part] += s.time_split[part]
    ranked = sorted(keys.items(), key=lambda kv: -sum(kv[1].values()))
    more = f", the {MAX_PLOTTED} longest of {len(ranked)}" if len(ranked) > MAX_PLOTTED else ""
    return ranked[:MAX_PLOTTED], f"time per shard key, summed over its shards ({len(report.shards)} shards{more})"


COLORS = {"none": "#9aa5b1", "ngram": "#2680c2", "draft_target": "#c65d21", "eagle3": "#7b61a8", "mtp": "#3e8e41"}


def _fig_rates(report: RunReport) -> str:
    import matplotlib.pyplot as plt

    if len(report.shards) > MAX_PLOTTED:
        return _fig_rates_scatter(report)
    shards = list(report.shards)
    names = [s.shard_id for s in shards]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 0.9 + 0.32 * max(len(shards), 3)), sharey=True)
    acc = [s.acceptance_rate or 0.0 for s in shards]
    a1.barh(names, acc, color=[COLORS.get(s.spec_method, "#2680c2") for s in shards])
    for y, s in enumerate(shards):
        a1.text(acc[y] + 0.01, y, "no drafts" if s.acceptance_rate is None else f"{s.acceptance_rate:.0%} ({s.spec_method} k={s.draft_len})", va="center", fontsize=8)
    a1.set_xlim(0, 1.25)
    a1.set_xlabel("acceptance rate (accepted / proposed)")
    a1.set_title("acceptance rate", fontsize=10)
    sp = [s.speedup or 0.0 for s in shards]
    a2.barh(names, sp, color=["#3e8e41" if v > 1 else "#9aa5b1" for v in sp])
    a2.axvline(1.0, color="#c62828", linestyle="--", linewidth=1)
    for y, s in enumerate(shards):
        a2.text(sp[y] + 0.02, y, "n/a" if s.speedup is None else f"{s.speedup:.2f}x", va="center", fontsize=8)
    a2.set_xlim(0, max([1.3, *sp]) * 1.2)
    a2.set_xlabel("speedup vs no speculation (decode tokens/s)")
    a2.set_title("speedup (dashed: 1x)", fontsize=10)
    a1.margins(y=0.01)
    a1.invert_yaxis()
    fig.tight_layout()
    return _png(fig)


def _fig_rates_scatter(report: RunReport) -> str:
    """Many shards: one dot per shard, acceptance rate against speedup, coloured by method."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for method in sorted({s.spec_method for s in report.shards}):
        group = [s for s in report.shards if s.spec_method == method]
        ax.scatter([s.acceptance_rate or 0.0 for s in group], [s.speedup or 0.0 for s in group], s=18, alpha=0.75,
                   color=COLORS.get(method, "#2680c2"), label=f"{method} ({len(group)} shards)")
    ax.axhline(1.0, color="#c62828", linestyle="--", linewidth=1)
    ax.set_xlim(-0.03, 1.03)
    ax.set_xlabel("acceptance rate (accepted / proposed; 0 where nothing was drafted)")
    ax.set_ylabel("speedup vs no speculation")
    ax.set_title(f"{len(report.shards)} shards, one dot each (dashed: 1x)", fontsize=10)
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    return _png(fig)


def _fig_arms(report: RunReport) -> str | None:
    import matplotlib.pyplot as plt

    with_arms = [s for s in report.shards if s.arms]
    shards = with_arms[:MAX_ARM_PANELS]
    if not shards:
        return None
    cols = min(4, len(shards))
    rows = (len(shards) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols, 0.6 + max(len(s.arms) for s in shards) * 0.28 * rows + 0.6 * rows), squeeze=False)
    for ax, s in zip(axes.flat, shards):
        labels = [a.label for a in s.arms]
        values = [a.tokens_per_s or a.predicted_tokens_per_s or 0.0 for a in s.arms]
        colors = ["#f0b429" if a.chosen else COLORS.get(a.spec_method, "#2680c2") for a in s.arms]
        bars = ax.barh(labels, values, color=colors, edgecolor=["#1f2933" if a.chosen else "none" for a in s.arms])
        for bar, a in zip(bars, s.arms):
            if a.tokens_per_s is None:  # predicted only: an outline, not a measurement
                bar.set_facecolor("none")
                bar.set_edgecolor(COLORS.get(a.spec_method, "#2680c2"))
                bar.set_hatch("//")
        for bar, a in zip(bars, s.arms):
            if a.tokens_per_s is not None:
                text = f"{a.tokens_per_s:.0f}" + (" chosen" if a.chosen else "")
            else:
                text = f"~{a.predicted_tokens_per_s:.0f} predicted" if a.predicted_tokens_per_s else "not measured"
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, " " + text, va="center", fontsize=7)
        ax.set_xlim(0, max([1.0, *values]) * 1.45)
        ax.invert_yaxis()
        ax.tick_params(labelsize=7)
        ax.set_title(f"{s.shard_id}", fontsize=9)
    for ax in list(axes.flat)[len(shards):]:
        ax.axis("off")
    fig.supxlabel("tokens/s per arm (gold: chosen; hatched: predicted, not measured)", fontsize=9)
    if len(with_arms) > len(shards):
        fig.suptitle(f"the first {len(shards)} of {len(with_arms)} calibrated shards", fontsize=10)
    fig.tight_layout()
    return _png(fig)


def _fig_time(report: RunReport) -> str:
    import matplotlib.pyplot as plt

    groups, title = _time_groups(report)
    palette = {"prefill": "#829ab1", "draft": "#2680c2", "verify": "#c65d21", "other": "#cbd2d9", "calibration": "#f0b429"}
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 0.9 + 0.32 * max(len(groups), 3)), gridspec_kw={"width_ratios": [3, 1]})
    names = [name for name, _ in groups]
    left = [0.0] * len(groups)
    for part in TIME_PARTS:
        values = [split[part] for _, split in groups]
        a1.barh(names, values, left=left, color=palette[part], label=part)
        left = [a + b for a, b in zip(left, values)]
    a1.margins(y=0.02)
    a1.invert_yaxis()
    a1.set_title(title, fontsize=10)
    a1.set_xlabel("seconds (colors: see the legend on the right)")
    total = report.totals.time_split
    nonzero = [(p, total[p]) for p in TIME_PARTS if total[p] > 0]
    if nonzero:
        a2.pie([v for _, v in nonzero], colors=[palette[p] for p, _ in nonzero], startangle=90, counterclock=False,
               autopct=lambda pct: f"{pct:.0f}%" if pct >= 4 else "", textprops={"fontsize": 8})
        a2.legend([f"{p} {v:.3g} s" for p, v in nonzero], fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    a2.set_title(f"all shards ({report.totals.wall_s:.1f} s)", fontsize=10)
    fig.tight_layout()
    return _png(fig)


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0%}"


def _num(v: float | None, digits: int = 1) -> str:
    return "n/a" if v is None else f"{v:,.{digits}f}"


def _x(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}x"
