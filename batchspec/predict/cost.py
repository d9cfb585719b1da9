"""The cost profile of a worker: what one step costs at a shape. No clock here: the
engine measures the points (`engine.profile`), this module lays out the grid and prices.

`CostProfile` holds the seconds of one target forward at a batch size, context length and tokens
per row (1 plain, 1 + k to verify k drafts), of one draft step, and of a draft's prefill, measured
once per worker over the grid `profile_grid` lays out and again only when a shard leaves what it
covers (a new batch size, a longer draft, a new draft model, or a middle context more than
CONTEXT_REACH from every measured width curve, unless a plain step, timed there, costs about the same).
A step costs what the tokens it computes in all (rows x tokens per row) cost: piecewise linear
through every measured batch's width curve nearest the step's context, each point at its rows x
tokens and times a context factor (the width-1 cost at the real context over that at the
curve's); `CostProfile._cost` says why tokens and not rows. batchspec.predict.replay prices
a sample's schedule step by step from it.
"""

from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Sequence

from batchspec.engine.base import StepCost

CONTEXT_REACH = 2.0  # a width curve prices shards whose middle context is within this factor of its own
CONTEXT_FLAT = 0.25  # ... or within its square, where a plain step costs within this fraction of the curve's
TIMINGS_KEPT = 4  # a re-timed point's price: the mean of its last this many timings (CostProfile.retime)
PRICES_KEPT = 100_000  # prices a profile remembers (`CostProfile._cost`) before it starts again: a few MB
ARM_KEPT = 4  # a speculative method's last measured-over-priced ratios (CostProfile.arm_measured); its steps priced at their median


def arm_key(method: str, draft_model: str | None = None) -> str:
    """A speculative method's key among `CostProfile.arm_ratios`: a draft model's steps are its own."""
    return f"{method}:{draft_model}" if method == "draft_target" else method


def profile_grid(batch_size: int, lo: int, hi: int, max_width: int,
                 draft_models: Sequence[str] = ()) -> tuple[list[tuple[int, int, int]], list[tuple[str, int, int, int]]]:
    """The (batch, context, tokens) target points and (draft, batch, context, tokens) draft points
    to measure for a shard whose rows hold `lo`..`hi` tokens of context and verify up to
    `max_width` tokens per row: widths 1, 3, 5, 9, ... up to max_width at the middle context
    and the production batch; width 1 at both ends of the context range; and batch 1 and half
    the batch at the narrowest and widest, for the steps of a batch not full (rows that drain it
    at the end, rows that end early). Prices run through the points by the tokens a forward
    computes in all (`CostProfile._cost`), and the half batch puts points between 1 and the
    batch size where nothing else does: on `make run`'s prose rows, where 4 to 6 of 8 rows are
    in flight, n-gram k=2's prediction was 11-48% optimistic without them and −3% to +18% with
    them. The widest verify is timed at
    `lo` too: a verify's cost can move with context more than a plain step's (`CostProfile._along`);
    not where the curve holds no width between 1 and the widest (k <= 2), where that pair would be
    a second width curve as full as the first, pricing the steps nearer it, which a re-time of the
    shard's curve (calibrate.profiling.retime_curve) would leave as first timed. A draft model's steps feed
    one token per row, but the first of a step feeds two to a row whose every draft the target
    accepted (the last draft was never fed: drafters.ModelDrafter.commit), so its curve has
    widths 1 and 2."""
    mid = (lo + hi) // 2
    widths = sorted({w for w in (1, 3, 5, 9, 17) if w < max_width} | {max_width})  # cost is near linear in width: 2 is interpolated
    target = {(batch_size, mid, w) for w in widths} | {(batch_size, c, 1) for c in (lo, hi)}
    if len(widths) > 2:  # how a verify's cost moves with context (`CostProfile._along`)
        target.add((batch_size, lo, max_width))
    if batch_size > 1:
        target |= {(1, mid, 1), (1, mid, max_width)}
    if batch_size > 2:
        target |= {(batch_size // 2, mid, 1), (batch_size // 2, mid, max_width)}
    drafts = {(d, b, c, w) for d in draft_models for b, c, w in ((batch_size, mid, 1), (batch_size, mid, 2),
                                                                   (batch_size, hi, 1), (1, mid, 1))}
    return sorted(target), sorted(drafts)


@dataclass
class CostProfile:
    """Measured step costs, as the engine reported them."""

    points: list[StepCost] = field(default_factory=list)
    measured_s: float = 0.0  # wall seconds spent measuring, summed over refreshes
    # batch sizes whose grid stopped at the width curve (calibrate.profiling.refresh_profile):
    # covered for no shard, so the next one at that batch prices on the curve again or measures the rest
    cut: set = field(default_factory=set)
    # batch size -> its grid's points below it (batch 1, half the batch) that a shard's profile left to a later
    # shard (calibrate.profiling.refresh_profile); a later shard at that batch times them first (`grid_needed`)
    owed: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)  # point key -> its last TIMINGS_KEPT timings, where re-timed
    # per speculative method (`arm_key`): its steps' measured time over the forwards' price of them,
    # its last ARM_KEPT confirmations' (`arm_measured`); an arm's steps are priced at their median
    arm_ratios: dict = field(default_factory=dict)
    # prices asked of these points (`_cost`): a replay prices every step of every arm, and a drift
    # check every few rows prices a window again; the points (their list and its length) key it
    _prices: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _layouts: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # (kind, model) -> `_layout`
    _priced_on: tuple = field(default=(), init=False, repr=False, compare=False)

    def covers(self, batch_size: int, lo: int, hi: int, max_width: int, draft_models: Sequence[str] = (),
               cut_too: bool = False) -> bool:
        """Does the profile hold, at this batch size, a width curve up to `max_width` near the
        middle of lo..hi, and the draft models (their two-token step too)? Near: within CONTEXT_REACH of the curve's context,
        or within its square where a plain step at lo and at hi costs within CONTEXT_FLAT of the
        curve's (short contexts, where weights, not attention, set the cost), as measured: lo and
        hi must lie within the contexts the profile timed plain steps at (`context_probe` gives
        the points to time where they do not). A batch whose grid was cut at the width curve
        (`cut`) is covered only `cut_too`.
        A curve that near prices the shard: the ratio of a wide step to a narrow one, which is
        all a predicted speedup uses, moves little with context, and a measured plain run sets
        the level."""
        return self._fit(batch_size, lo, hi, max_width, draft_models, cut_too) == "covered"

    def context_probe(self, batch_size: int, lo: int, hi: int, max_width: int,
                      draft_models: Sequence[str] = ()) -> list[tuple[int, int, int]]:
        """The plain-step points (batch_size, context, 1) to time where the profile would cover the
        shard but cannot tell whether a plain step costs about the same at its lo and hi as on the
        width curve (they lie outside the contexts it timed; extrapolating a few noisy points
        across a context four times shorter or longer can say anything): two forwards' worth,
        where a new grid costs a dozen. [] where it covers the shard, or misses it anyway.
        (`make run`'s prose shard, contexts 10..39 against a curve at 78 measured on the edit
        shard: the extrapolation put a plain step at context 10 at 0.6x the curve's and the
        shard measured a whole grid, 1.4 s; timed, it cost 0.93x.)"""
        if self._fit(batch_size, lo, hi, max_width, draft_models) != "context":
            return []
        timed = self._plain_contexts(batch_size)
        return [(batch_size, c, 1) for c in sorted({lo, hi}) if not timed or not min(timed) <= c <= max(timed)]

    def _plain_contexts(self, batch_size: int) -> set[int]:
        return {p.context for p in self.points if p.kind == "target" and p.batch == batch_size and p.tokens == 1}

    def _fit(self, batch_size: int, lo: int, hi: int, max_width: int, draft_models: Sequence[str],
             cut_too: bool = False) -> str:
        """"covered"; "context" where only the flatness of a plain step at lo and hi, outside the
        contexts timed, stands between the profile and the shard; "missed" where a grid is needed."""
        mine = [p for p in self.points if p.kind == "target" and p.batch == batch_size]
        mid = (lo + hi) // 2
        curve = self._curve(mine, mid)
        if not curve or max(p.tokens for p in curve) < max_width:
            return "missed"
        if not all(any(p.kind == "draft" and p.model == d and p.batch == batch_size and p.tokens == 2 for p in self.points)
                   for d in draft_models):
            return "missed"
        if batch_size in self.cut and not cut_too:  # `cut_too`: as if it had not been cut
            return "missed"
        home = curve[0].context
        if home / CONTEXT_REACH <= mid <= home * CONTEXT_REACH:
            return "covered"
        if not home / CONTEXT_REACH ** 2 <= mid <= home * CONTEXT_REACH ** 2:
            return "missed"
        timed = self._plain_contexts(batch_size)
        if not timed or not min(timed) <= lo <= hi <= max(timed):
            return "context"
        plain = self._at_batch(mine, home, 1)
        flat = plain > 0 and all(abs(self._at_batch(mine, c, 1) / plain - 1) <= CONTEXT_FLAT for c in (lo, hi))
        return "covered" if flat else "missed"

    @staticmethod
    def _curve(pts: Sequence[StepCost], context: int) -> list[StepCost]:
        """The points of the context nearest `context` (by ratio) among those measured at more than
        one width (all, where none was), narrowest first; [] without points. A context measured
        at only some of another's widths, up to the same widest, is not a curve: its points set
        the context factor of wide steps (`_along`)."""
        return CostProfile._nearest(CostProfile._curves(pts), context)

    @staticmethod
    def _curves(pts: Sequence[StepCost]) -> dict[int, list[StepCost]]:
        """The contexts `_curve` chooses among, each with its points narrowest first."""
        by_context: dict[int, list[StepCost]] = {}
        for p in pts:
            by_context.setdefault(p.context, []).append(p)
        widths = {c: {p.tokens for p in ps} for c, ps in by_context.items()}
        # a context timed at some of another's widths up to the same widest (`profile_grid`'s
        # widest verify at lo) tells how a width's cost moves with context; it is no curve
        factor_only = {c for c, ws in widths.items() if any(ws < o and max(ws) == max(o) for o in widths.values())}
        curves = {c: ps for c, ps in by_context.items() if len(ps) > 1 and c not in factor_only} or by_context
        return {c: sorted(ps, key=lambda p: p.tokens) for c, ps in curves.items()}

    @staticmethod
    def _nearest(curves: dict[int, list[StepCost]], context: int) -> list[StepCost]:
        """The curve whose context is nearest `context` by ratio (the lower on a tie); [] without one."""
        if not curves:
            return []
        return curves[min(curves, key=lambda c: (abs(math.log(max(c, 1) / max(context, 1))), c))]

    def arm_scale(self, method: str, draft_model: str | None = None) -> float:
        """What a step of `method` costs on this worker over what the points price it at: the
        median of the ratios its confirmations measured (`arm_measured`), 1.0 before the first
        and for plain decoding.

        The points time the target's forwards and the accept rule on probes; a speculative step
        also drafts, keeps some of its slots and not others, and commits several tokens a row,
        Python work per step that plain decoding's bookkeeping (the anchor's) does not hold, and
        the width curve can price a verify off against a plain step. Where a step is slow this
        hardly counts; where it is fast it does: on a 3.7 ms batch-8 step (held-out rows)
        n-gram steps ran 1.10-1.26x their price against plain
        decoding's, and every arm's speedup was predicted 15-32% high (the profile prices a wide
        verify low against a plain step as the decode loop runs them, though a probe timed apart
        from a decode costs what its point does). A ratio measured is the whole step's, as the
        engine ran it. (On an H200, predictions ran 12-50% high at batch 4 and 8; whether this
        corrects that is untested.)"""
        kept = self.arm_ratios.get(arm_key(method, draft_model)) if method != "none" else None
        return statistics.median(kept) if kept else 1.0

    def arm_measured(self, method: str, draft_model: str | None, ratio: float) -> float:
        """A confirmation measured `method`'s steps at `ratio` times their price as this profile
        prices them now (`arm_scale` included): kept as a ratio to the points' price, the last
        ARM_KEPT of them. Returns the method's scale before over its scale now: what a prediction
        made before is multiplied by to stand as the profile now prices it (the drift watch's
        discount of a confirmed-losing arm is taken against that, or the ratio would count twice)."""
        before = self.arm_scale(method, draft_model)
        if method == "none" or not (ratio > 0 and math.isfinite(ratio)):
            return 1.0
        key = arm_key(method, draft_model)
        self.arm_ratios[key] = [*self.arm_ratios.get(key, ())[-(ARM_KEPT - 1):], ratio * before]
        return before / self.arm_scale(method, draft_model)

    def merge(self, points: Sequence[StepCost], seconds: float) -> None:
        new = {p.key for p in points}
        self.points = [p for p in self.points if p.key not in new] + list(points)
        self._prices, self._layouts, self._priced_on = {}, {}, ()
        self.measured_s += seconds
        for key in new:
            self.timings.pop(key, None)
        timed = {k[2:] for k in new if k[0] == "target"}
        self.owed = {b: left for b, pts in self.owed.items() if (left := [p for p in pts if p not in timed])}

    def retime(self, points: Sequence[StepCost], seconds: float) -> None:
        """`points` timed again: each priced from now on at the mean of its last TIMINGS_KEPT
        timings, the one it held first included. One profile's points stand up to 15-26% from the
        machine's mean prices on a shared CPU (the 10th to 90th percentile of a width over plain
        at batch 8), the mean of two profiles' 4-14%, of four 4-7%; and a profile timed once ages
        (the first profile's bias 0.89 at the median over a worker's rounds, one re-timed before
        each 1.00). The oldest timing drops out."""
        held = {p.key: p.seconds for p in self.points}
        timings = {p.key: [*(self.timings.get(p.key) or ([held[p.key]] if p.key in held else [])), p.seconds][-TIMINGS_KEPT:]
                   for p in points}
        self.merge([replace(p, seconds=sum(timings[p.key]) / len(timings[p.key])) for p in points], seconds)
        self.timings.update(timings)  # after the merge, which forgets the timings of the points it replaces

    def width_curve(self, batch_size: int, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """The (batch, context, tokens) target points of `batch_size`'s width curve that prices a
        shard of contexts lo..hi (`_curve`, at their middle), narrowest first; [] where none is held."""
        curve = self._curve([p for p in self.points if p.kind == "target" and p.batch == batch_size], (lo + hi) // 2)
        return [(p.batch, p.context, p.tokens) for p in curve] if len(curve) > 1 else []

    def target_s(self, batch: int, context: int, tokens: int) -> float:
        return self._cost("target", None, batch, context, tokens)

    def draft_s(self, model: str, batch: int, context: int, tokens: int = 1) -> float:
        return self._cost("draft", model, batch, context, tokens)

    def draft_prefill_s(self, model: str, tokens: int) -> float:
        per = [p.seconds / p.tokens for p in self.points if p.kind == "draft_prefill" and p.model == model and p.tokens]
        return tokens * sum(per) / len(per) if per else 0.0

    def _cost(self, kind: str, model: str | None, batch: int, context: int, tokens: int) -> float:
        """A forward of `batch` rows x `tokens` each, priced by the tokens it computes in all: every
        measured batch's width curve, moved to `context` by its context factor, gives (rows x
        tokens, seconds) points, and the price runs piecewise linear through them (rising: never
        cheaper for more tokens). The linear layers, most of a forward at these sizes, cost what
        their row count costs, whichever rows they come from: on SmolLM2 (float32, 2 threads)
        forwards of equal tokens cost about the same (12 tokens as 1x12 ... 12x1: 61-65 ms), and
        priced this way from the profile's points every batch 1..8 x width 1..9 forward was off by
        5.2% on average at context 40 against 7.7% priced linear in rows between batch 1 and the
        production batch; at context 400 7.3% against 7.2%, a tie; Qwen2.5-Coder-1.5B at batch
        4, context 200, 12.9% against 16.4%. Not modelled
        apart: the cache each row reads, which grows with rows, not tokens (the likely reason for
        the tie at 400; a GPU at long contexts may show more of it). A price is a function of the
        points alone: each is worked out once while they stand (`_priced`)."""
        key = (kind, model, batch, context, tokens)
        on = (id(self.points), len(self.points))
        if self._priced_on != on or len(self._prices) >= PRICES_KEPT:
            self._prices, self._layouts, self._priced_on = {}, {}, on
        price = self._prices.get(key)
        if price is None:
            price = self._prices[key] = self._priced(*key)
        return price

    def _priced(self, kind: str, model: str | None, batch: int, context: int, tokens: int) -> float:
        layout = self._layouts.get((kind, model))
        if layout is None:
            layout = self._layouts[(kind, model)] = self._layout(kind, model)
        narrow, per_batch, at_context = layout
        line = at_context.get(context)
        if line is None:  # what a context's prices are read from, whatever the batch and width asked
            by_tokens: dict[int, list[float]] = {}
            for b, curves, moves in per_batch:
                curve = self._nearest(curves, context)
                home = curve[0].context
                if home not in moves:
                    moves[home] = _Moved(curve, narrow)
                for width, seconds in moves[home].at(context):
                    by_tokens.setdefault(b * width, []).append(seconds)
            ns = sorted(by_tokens)
            line = at_context[context] = (ns, _rising([sum(by_tokens[n]) / len(by_tokens[n]) for n in ns]))
        return _lerp(*line, batch * tokens)

    def _layout(self, kind: str, model: str | None) -> tuple[list[StepCost], list[tuple[int, dict, dict]], dict]:
        """What `_priced` reads of the points whatever the context: the points that set the
        context factor, and per batch size its curves (`_curves`) and each curve's moves
        (`_Moved`, filled as contexts ask for them); and, filled as contexts ask for them, each
        context's (tokens in all, seconds) line that every batch and width there is priced on (a
        replay's steps each bring a new context, and each arm's replay passes the others'; on
        a fast model's decision a price not yet worked out took 14 µs, most of it this line)."""
        pts = [p for p in self.points if p.kind == kind and (model is None or p.model == model)]
        assert pts, f"no {kind} cost measured"
        batches = sorted({p.batch for p in pts})
        # the context factor of every batch from the one measured at the most contexts (the
        # production batch: lo, middle and hi; batch 1 only at the middle)
        ref = max(batches, key=lambda b: (len({p.context for p in pts if p.batch == b}), b))
        narrow = [p for p in pts if p.batch == ref]
        return narrow, [(b, self._curves([p for p in pts if p.batch == b]), {}) for b in batches], {}

    @classmethod
    def _along(cls, pts: Sequence[StepCost], context: int,
               factor_pts: Sequence[StepCost] | None = None) -> list[tuple[int, float]]:
        """(tokens per row, seconds) along the width curve of `pts` (one batch size) nearest
        `context`, rising, each times the context factor: the width-1 cost at `context` over that
        at the curve's own, on the least-squares line through the narrowest point of every
        context measured in `factor_pts` (default `pts`), never falling (`_line`); for the wider
        points, the same through the curve's widest width where `factor_pts` timed it at more
        than one context. A verify's cost can move with context more than a plain step's: on a
        CPU a single new token per row takes another attention path (kv.Batch._attention_inputs),
        and at batch 8 on SmolLM2 (float32, 2 threads) a step at 300 slots cost 0.88x one at 600
        for one token per row and 0.78-0.83x for 2 to 9. Moved by the plain steps' line, a verify
        at 297-387 slots, below a curve at 581, was priced 6-12% dear against a plain step (the
        median over six profiles, each against probes of those shapes; by the widest verify's
        line 0.98-1.02), and every speedup predicted there came out low; a probe of a loop step's
        own shape costs what the step does. At
        batch 4 and 1 the two lines agree within 2%."""
        return _Moved(cls._curve(pts, context), factor_pts or pts).at(context)

    @classmethod
    def _at_batch(cls, pts: Sequence[StepCost], context: int, tokens: int) -> float:
        """The cost of `tokens` per row along `pts`' width curve (one batch size) at `context`."""
        along = cls._along(pts, context)
        return _lerp([w for w, _ in along], [s for _, s in along], tokens)

    def to_struct(self) -> list[dict]:
        return [p.to_struct() for p in self.points]


class _Moved:
    """A width curve and the lines that move it to another context (`CostProfile._along`): the
    line through the narrowest point of every context of `factor_pts` moves the curve's narrowest
    width, the line through its widest width's points there (where they lie at more than one
    context) the wider ones, each as its value at the context over its value at the curve's own."""

    __slots__ = ("tokens", "seconds", "narrowest", "plain", "wide")

    def __init__(self, curve: Sequence[StepCost], factor_pts: Sequence[StepCost]) -> None:
        home = curve[0].context
        narrow: dict[int, float] = {}
        for p in sorted(factor_pts, key=lambda p: (p.context, -p.tokens)):
            narrow[p.context] = p.seconds  # the narrowest point of each context
        self.tokens, self.seconds = [p.tokens for p in curve], [p.seconds for p in curve]
        self.narrowest, widest = curve[0].tokens, curve[-1].tokens
        wide_points = {p.context: p.seconds for p in factor_pts if widest > self.narrowest and p.tokens == widest}
        self.plain = _factor(narrow, home)
        self.wide = _factor(wide_points, home) if len(wide_points) > 1 else self.plain

    def at(self, context: int) -> list[tuple[int, float]]:
        """(tokens per row, seconds) along the curve moved to `context`, rising."""
        plain, wide = self.plain(context), self.wide(context)
        moved = [s * (plain if t == self.narrowest else wide) for t, s in zip(self.tokens, self.seconds)]
        return list(zip(self.tokens, _rising(moved)))


def _factor(points: dict[int, float], home: int):
    """context -> the least-squares line through `points` (context -> seconds, `_line`) there, over
    its value at `home` (1.0 where that is 0)."""
    line = _line(list(points), list(points.values()))
    base = line(home)  # the curve's own context may lie between those of the points
    return (lambda context: line(context) / base) if base > 0 else (lambda context: 1.0)


def _rising(ys: Sequence[float]) -> list[float]:
    """Costs never fall with more tokens or more context: a point below an earlier one was timed
    in a quiet moment of a shared machine, so it takes the earlier value (a running maximum)."""
    out: list[float] = []
    for y in ys:
        out.append(max(y, out[-1]) if out else y)
    return out


def _line(xs: Sequence[float], ys: Sequence[float]):
    """The least-squares line through (xs, ys), its slope at least 0 (flat at the mean where the
    points fall, or with one point), as a function never below 0. A step's cost moves with its
    context by what attention reads, linear in the slots; the points are plain steps timed at a
    few contexts, each off by the machine's noise. Piecewise through them, a point timed in a
    noisy moment bent the factor, and past the last point its slope went on:
    on a code shard at batch 8 plain steps timed at contexts 66, 85 and 105 (72.6, 72.4 and
    81.0 ms; the same point's first try 95.0 ms) priced a step at 250 slots 1.95x one at 85,
    the shard's 5-wide steps 1.45x their measured time on average, where those at 240-279 slots
    measured 1.06x those at 80-119."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx) if sxx > 0 else 0.0
    return lambda x: max(0.0, my + slope * (x - mx))


def _lerp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise linear through (xs, ys), extended linearly past either end (flat with one point)."""
    if len(xs) == 1:
        return ys[0]
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))
