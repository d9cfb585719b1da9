"""The report's plots (matplotlib, Agg), each returned as a base64 PNG for the HTML page."""

from __future__ import annotations

import base64
import io

from batchspec.report.load import MAX_ARM_PANELS, MAX_PLOTTED, TIME_PARTS, RunReport
from batchspec.report.savings import sig
from batchspec.stats import ArmResult


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


def arm_bar(a: ArmResult) -> tuple[float, str]:
    """One arm's bar in the arms plot: its predicted speedup over plain decoding (every arm
    calibration priced has one, run or not), and its label: what it ran, where it ran."""
    if a.predicted_speedup is None:
        return 0.0, (a.error or "not priced")[:40]
    ran = f", ran {a.rows_run} rows" + (f" at {a.tokens_per_s:.0f} tok/s" if a.tokens_per_s else "") if a.measured else ""
    return a.predicted_speedup, f"{a.predicted_speedup:.2f}x{ran}"


def _fig_arms(report: RunReport) -> str | None:
    import matplotlib.pyplot as plt

    with_arms = [s for s in report.shards if s.candidates]
    shards = with_arms[:MAX_ARM_PANELS]
    if not shards:
        return None
    cols = min(4, len(shards))
    rows = (len(shards) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols, 0.6 + max(len(s.candidates) for s in shards) * 0.28 * rows + 0.6 * rows), squeeze=False)
    for ax, s in zip(axes.flat, shards):
        labels = [a.label for a in s.candidates]
        values, texts = zip(*(arm_bar(a) for a in s.candidates))
        colors = ["#f0b429" if a is s.chosen else COLORS.get(a.method, "#2680c2") for a in s.candidates]
        bars = ax.barh(labels, values, color=colors, edgecolor=["#1f2933" if a is s.chosen else "none" for a in s.candidates])
        for bar, text in zip(bars, texts):
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, " " + text, va="center", fontsize=7)
        ax.axvline(1.0, color="#52606d", linewidth=0.8, linestyle=":")
        ax.set_xlim(0, max([1.0, *values]) * 1.6)
        ax.invert_yaxis()
        ax.tick_params(labelsize=7)
        ax.set_title(f"{s.shard_id}", fontsize=9)
    for ax in list(axes.flat)[len(shards):]:
        ax.axis("off")
    fig.supxlabel("predicted speedup over plain decoding, per arm (gold: chosen; dotted: plain decoding)", fontsize=9)
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


def _fig_saved(report: RunReport) -> str | None:
    """Saved device-hours per shard key (the MAX_PLOTTED keys that saved or lost most), with their
    uncertainty as error bars; None where no shard has plain decoding's price."""
    import matplotlib.pyplot as plt

    s = report.savings
    keys = [h for h in (s.keys if s is not None else ()) if h.saved_h is not None]
    if not keys:
        return None
    keys = sorted(keys, key=lambda h: -abs(h.saved_h))[:MAX_PLOTTED]
    names = [str(h.key) if h.key is not None else "(no key)" for h in keys]
    saved = [h.saved_h for h in keys]
    fig, ax = plt.subplots(figsize=(9, 0.9 + 0.32 * max(len(keys), 3)))
    ax.barh(names, saved, xerr=[h.saved_err_h or 0.0 for h in keys], capsize=3,
            color=["#3e8e41" if v > 0 else "#c62828" for v in saved], error_kw={"ecolor": "#1f2933", "elinewidth": 1})
    for y, h in enumerate(keys):
        ax.text(h.saved_h, y, f" {sig(h.saved_h, 3)} of {sig(h.plain_h, 3)}" + (" (estimate)" if h.estimated else ""),
                va="center", fontsize=8)
    ax.axvline(0.0, color="#52606d", linewidth=0.8)
    ax.invert_yaxis()
    ax.set_xlabel(f"{s.unit}-hours saved against plain decoding (bars: the cost tables' uncertainty)")
    more = f", the {len(keys)} that moved most of {len(s.keys)}" if len(s.keys) > len(keys) else ""
    ax.set_title(f"{s.unit}-hours saved per shard key{more} (run: {sig(s.run.saved_h, 3)} of {sig(s.run.plain_h, 3)})", fontsize=10)
    fig.tight_layout()
    return _png(fig)
