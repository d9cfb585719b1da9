"""The report as a self-contained HTML page (plots inline as PNGs) and as table rows shared with the
terminal. Reads only a `RunReport` (load.py)."""

from __future__ import annotations

import html

from batchspec.report.load import RunReport, _num, _pct, _x
from batchspec.report.plots import _fig_arms, _fig_rates, _fig_saved, _fig_time
from batchspec.report.savings import header, notes, row, sig


def render_html(report: RunReport) -> str:
    """A self-contained page: summary, plots as inline PNGs, and the per-shard table."""
    import matplotlib

    matplotlib.use("Agg")
    with matplotlib.rc_context({"text.parse_math": False}):  # a shard key or id is text, never mathtext ("$...$")
        figures = [
            ("Acceptance and speedup per shard", _fig_rates(report)),
            ("Calibrated arms per shard (predicted speedup over plain decoding; the chosen arm is highlighted)", _fig_arms(report)),
            ("Where the time went", _fig_time(report)),
            (f"{report.savings.unit}-hours saved per shard key" if report.savings else "", _fig_saved(report)),
        ]
    t = report.totals
    cards = [
        ("rows", f"{t.rows:,}", f"{t.error_rows} with errors"),
        ("shards", f"{t.shards}" + (f" / {t.planned_shards}" if t.planned_shards is not None else ""), "complete" if report.complete else "NOT finished"),
        ("speedup vs none", _x(t.speedup), f"baseline {_num(t.baseline_tokens_per_s)} tok/s"
         + (f"; {_pct(t.speedup_predicted_share)} of decode time predicted, not measured" if t.speedup_predicted_share else "")),
        ("acceptance rate", _pct(t.acceptance_rate), f"mean accepted len {_num(t.mean_accepted_len, 2)}"),
        ("decode tokens/s", _num(t.tokens_per_s), f"{t.output_tokens:,} output tokens"),
        ("calibration share", _pct(t.calibration_share), f"of {t.wall_s:.1f} shard-seconds, none of it output"),
    ]
    saved = report.savings
    if saved is not None and saved.run.shards:
        cards.append((f"{saved.unit}-hours saved", sig(saved.run.saved_h, 3) + ("" if saved.run.saved_err_h is None else f" ± {sig(saved.run.saved_err_h, 2)}"),
                      f"of {sig(saved.run.used_h, 3)} used; {sig(saved.run.tokens_per_h, 3)} out tok/{saved.unit}-h"
                      + (f"; {sig(saved.run.cost_per_mtok, 3)} per M tok" if saved.price is not None else "")))
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
.cards{{display:grid;grid-template-columns:repeat(auto-fit,minmax(150px,1fr));gap:10px}}
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
{_savings_table(report)}
{_events_table(report)}
</body></html>
"""


def table_rows(report: RunReport) -> tuple[list[str], list[list[str]], list[str]]:
    """Header, one row per shard, and the totals row: shared by the terminal and the HTML table."""
    header = ["shard", "key", "rows", "errors", "method", "k", "decision", "accept", "mean acc len", "tok/s", "baseline tok/s", "speedup", "calib share"]
    rows = [[s.shard_id, s.shard_key or "-", str(s.rows), str(s.error_rows), s.spec_method, str(s.draft_len) if s.spec_method != "none" else "-",
             (s.decision_source or "-") + _switches(s),
             _pct(s.acceptance_rate), _num(s.mean_accepted_len, 2), _num(s.tokens_per_s), _num(s.baseline_tokens_per_s), _x(s.speedup),
             _pct(s.calibration_share)] for s in report.shards]
    t = report.totals
    total = ["total", f"{t.shards} shards", str(t.rows), str(t.error_rows), "", "", "", _pct(t.acceptance_rate), _num(t.mean_accepted_len, 2),
             _num(t.tokens_per_s), _num(t.baseline_tokens_per_s), _x(t.speedup), _pct(t.calibration_share)]
    return header, rows, total


def _switches(s) -> str:
    """A shard's switches, as `switch@ROW->ARM` (the whole story is its events)."""
    return "".join(f" {e.kind}@{e.row}->{e.arm}" for e in s.events if e.kind == "switch")


def event_rows(report: RunReport) -> list[list[str]]:
    """Every shard's calibration events, in order: shard, rows finished, kind, arm, predicted, measured, why."""
    return [[s.shard_id, str(e.row), e.kind, e.arm, _x(e.predicted), _num(e.measured, 2), e.reason]
            for s in report.shards for e in s.events]


def _events_table(report: RunReport) -> str:
    rows = event_rows(report)
    if not rows:
        return ""
    cell = lambda tag, xs: "<tr>" + "".join(f"<{tag}>{html.escape(x)}</{tag}>" for x in xs) + "</tr>"  # noqa: E731
    header = ["shard", "row", "event", "arm", "predicted", "measured", "why"]
    return (f"<section><h2>Calibration events</h2><table><thead>{cell('th', header)}</thead>"
            f"<tbody>{''.join(cell('td', r) for r in rows)}</tbody></table></section>")


def _savings_table(report: RunReport) -> str:
    s = report.savings
    if s is None or not s.run.shards:
        return ""
    cell = lambda tag, xs: "<tr>" + "".join(f"<{tag}>{html.escape(x)}</{tag}>" for x in xs) + "</tr>"  # noqa: E731
    body = "".join(cell("td", row(h, s)) for h in s.keys)
    foot = "".join(f'<p class="s">{html.escape(line)}</p>' for line in notes(s))
    return (f"<section><h2>What speculation saved, in {s.unit}-hours</h2><table><thead>{cell('th', header(s))}</thead>"
            f"<tbody>{body}</tbody><tfoot>{cell('td', row(s.run, s))}</tfoot></table>{foot}</section>")


def _html_table(report: RunReport) -> str:
    header, rows, total = table_rows(report)
    cell = lambda tag, xs: "<tr>" + "".join(f"<{tag}>{html.escape(x)}</{tag}>" for x in xs) + "</tr>"  # noqa: E731
    body = "".join(cell("td", r) for r in rows)
    return f"<table><thead>{cell('th', header)}</thead><tbody>{body}</tbody><tfoot>{cell('td', total)}</tfoot></table>"
