"""What speculation saved, in GPU-hours (CPU-hours on CPU workers): per shard key and for the run,
summed from the stats' device columns (batchspec.stats.device_seconds), nothing else.

    used            sum(gpu_s) / 3600 over the shards that measured it
    plain           sum(plain_gpu_s) / 3600: the same rows as plain decoding, the worker's cost table's
                    price where plain decoding did not run (an estimate, `estimated`)
    saved           plain - used, over the shards that have both (`priced`), within
                    +- sum(plain_gpu_s_err) / 3600: one worker's table prices many shards, so their
                    errors are summed as one, not added in quadrature
    tokens per hour output tokens of the measured shards / used
    with a price P per device-hour:
      cost per million output tokens = P x used / (output tokens / 1e6)
      money saved                    = P x saved, within +- P x its uncertainty

Calibration's seconds count in used and not in plain (plain decoding calibrates nothing), so a
shard that ran plain decoding throughout saved minus its calibration. A shard without gpu_s (no row
ran, or written before the column existed) is left out and counted in `unmeasured`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from batchspec.stats import ShardStats

HOUR = 3600.0
UNITS = {"gpu": "GPU", "cpu": "CPU"}


@dataclass(frozen=True)
class Hours:
    """Device-hours of a set of shards (one shard key, or the run)."""

    key: str | None  # the shard key; None: every shard of the run
    shards: int  # shards that measured gpu_s
    priced: int  # of those, with plain decoding's price (plain_gpu_s)
    used_h: float
    plain_h: float | None  # over the priced shards
    saved_h: float | None  # plain_h - their used hours
    saved_err_h: float | None  # saved_h's uncertainty (the cost table's intervals)
    estimated: bool  # plain_h holds a price, not only measurements
    output_tokens: int  # of the measured shards
    tokens_per_h: float | None  # output tokens per device-hour used
    cost_per_mtok: float | None = None  # with a price: per million output tokens
    money_saved: float | None = None  # with a price: saved_h x price
    money_err: float | None = None


@dataclass(frozen=True)
class Savings:
    unit: str  # GPU | CPU | device (a run whose shards ran on both)
    price: float | None  # per device-hour (--gpu-hour-price), None: not given
    keys: tuple[Hours, ...]  # per shard key, in key order
    run: Hours
    unmeasured: int  # shards without gpu_s


def savings(shards: Iterable[ShardStats], price: float | None = None) -> Savings:
    shards = list(shards)
    measured = [s for s in shards if s.gpu_s is not None]
    units = {UNITS.get(s.device or "", "device") for s in measured}
    unit = units.pop() if len(units) == 1 else "device"
    by_key: dict[str | None, list[ShardStats]] = {}
    for s in measured:
        by_key.setdefault(s.shard_key, []).append(s)
    keys = tuple(hours(by_key[k], k, price) for k in sorted(by_key, key=lambda k: (k is None, k or "")))
    return Savings(unit, price, keys, hours(measured, None, price), len(shards) - len(measured))


def hours(shards: list[ShardStats], key: str | None, price: float | None) -> Hours:
    """`Hours` of `shards` (each with gpu_s), under `price` per device-hour."""
    priced = [s for s in shards if s.plain_gpu_s is not None]
    used = sum(s.gpu_s for s in shards) / HOUR
    tokens = sum(s.output_tokens for s in shards)
    plain = sum(s.plain_gpu_s for s in priced) / HOUR if priced else None
    saved = plain - sum(s.gpu_s for s in priced) / HOUR if priced else None
    err = sum(s.plain_gpu_s_err or 0.0 for s in priced) / HOUR if priced else None
    money = {}
    if price is not None:
        money = {"cost_per_mtok": price * used / (tokens / 1e6) if tokens else None,
                 "money_saved": None if saved is None else price * saved, "money_err": None if err is None else price * err}
    return Hours(key, len(shards), len(priced), used, plain, saved, err, any(s.plain_estimated for s in priced), tokens,
                 tokens / used if used > 0 else None, **money)


def sig(value: float | None, digits: int = 4) -> str:
    """`value` to `digits` significant digits in plain notation, thousands grouped (a whole number
    keeps all its digits); n/a for None."""
    if value is None:
        return "n/a"
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    if abs(value) >= 10 ** (digits - 1):
        return f"{value:,.0f}"
    rounded = float(f"{value:.{digits - 1}e}")  # its magnitude after rounding: 999.96 is 1,000
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(rounded))))
    return f"{rounded:,.{decimals}f}"


def header(s: Savings) -> list[str]:
    u = s.unit
    head = ["key", "shards", f"{u}-h used", f"{u}-h plain", f"{u}-h saved", "+-", f"out tok / {u}-h"]
    return head + (["cost / M out tok", "saved"] if s.price is not None else [])


def row(h: Hours, s: Savings) -> list[str]:
    """One line of the table: the numbers as `sig` prints them."""
    cells = [h.key if h.key is not None else ("run" if h is s.run else "(no key)"), str(h.shards), sig(h.used_h), sig(h.plain_h),
             sig(h.saved_h) + ("*" if h.estimated else ""), sig(h.saved_err_h), sig(h.tokens_per_h)]
    if s.price is not None:
        cells += [sig(h.cost_per_mtok), sig(h.money_saved) + ("" if h.money_err is None else f" +- {sig(h.money_err)}")]
    return cells


def notes(s: Savings) -> list[str]:
    """What the table's marks and gaps mean, one line each."""
    out = []
    if s.run.estimated:
        out.append("* plain decoding priced by the workers' cost tables (an estimate: it did not run those steps); "
                   "+- from the tables' intervals")
    if s.run.priced < s.run.shards:
        out.append(f"{s.run.shards - s.run.priced} shard(s) without plain decoding's price: in used, not in plain or saved")
    if s.unmeasured:
        out.append(f"{s.unmeasured} shard(s) without {s.unit}-seconds (no row ran, or written before the column existed): left out")
    if s.price is not None:
        out.append(f"at {sig(s.price)} per {s.unit}-hour")
    return out
