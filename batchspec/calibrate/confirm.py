"""The confirmation of calibration in flight (batchspec.calibrate.inflight, its "confirm" phase):
where calibration wants a measurement, the arm it chose runs on from the decision, and once it has
committed a few sample rows' worth of tokens its steps are set against plain decoding's price of
the same tokens (`confirmed_speedup`), and counterfactual.settle decides.

Plain decoding's price is measured on both sides of the arm's steps where it can be: the
sample's (or `plain_first`'s) plain steps before them and as many plain steps after them
(`plain_after`), and the faster of the two prices it (`sandwiched`): about twenty steps take a
tenth of a second on a fast model, and a shared machine's speed moves by a quarter on that scale.

`Confirming` is `InFlight`'s part that keeps the confirmation's bookkeeping (where it began, what it
waits for, which side it measures); it reads the control's state (`verdict`, `worker`, `key`,
`settings`, `order`, `watch`, `batch_size`, `_run`, `_stretch`, `_reanchor`), sets its phase's
outcome (`phase`, `since`, `reason`, `confirmed`, `lost_s`), and nothing else uses it.
"""

from __future__ import annotations

from batchspec.calibrate.counterfactual import CONFIRM_MIN_ROWS, settle
from batchspec.calibrate.pricing import Anchor, arm_price_s, plain_price_s
from batchspec.engine.base import NO_SPEC, Progress, SpecConfig, Step, Timing

# Plain decoding's two prices of a window (before it, after it) further apart than this: the
# machine moved while it was measured, and the window can lower the sample's prediction, not raise
# it (`Confirming._measure`). On a quiet machine the two stand within a few percent; a burst of
# other work on one side moves them apart by far more than this.
DISTURBED = 0.25


def confirmed_speedup(predicted: float, ratio: float, window: float) -> tuple[float, str]:
    """What a confirmation in flight decides by: the lower of the sample's `predicted` speedup
    corrected by `ratio` (the arm's steps' measured time over the profile's price of them) and
    the `window`'s own measured speedup, with the reason's words for it."""
    corrected = predicted / ratio
    if window < corrected:
        return window, f"those steps alone measured {window:.2f}x, below the sample's {predicted:.2f}x corrected ({corrected:.2f}x)"
    return corrected, f"the sample's {predicted:.2f}x corrected (those steps alone measured {window:.2f}x)"


def sandwiched(steps: list[Step], anchors: list[Anchor], profile) -> tuple[Anchor, float, list[float]]:
    """The anchor that prices plain decoding of the arm's `steps` where plain decoding was measured
    on both sides of them: the one that prices it the lower (the machine at its faster), with that
    price and each anchor's. A shared machine's interference slows a stretch, never speeds it, so
    the faster plain stretch is the nearer measure of plain decoding beside the arm's; an arm that
    beat plain decoding only against a slowed stretch is not taken for one that pays."""
    prices = [plain_price_s(steps, a, profile) for a in anchors]
    i = min(range(len(anchors)), key=prices.__getitem__)
    return anchors[i], prices[i], prices


class Confirming:
    """Where the confirmation began (`mark`: steps, timing, rows done), the tokens it waits for
    (`confirm_tokens`, counted in `confirm_seen`), whether it measures plain decoding
    (`plain_side`: the sample itself ran the arm), whether plain decoding runs first to price
    the arm against (`plain_first`: the sample ran another arm) and the anchor it gave (`fresh`),
    and whether plain decoding runs after the arm's steps (`plain_after`, the arm's measured
    `window` kept until it ends). `plain_s` is the decode time of the plain stretches the
    confirmation added: if the arm pays, what they ran beyond its time is calibration's cost."""

    mark = None
    confirm_tokens = 0.0
    confirm_seen = (0, 0)
    plain_side = False
    plain_first = False
    plain_after = False
    window = None
    fresh = None
    mean = 0.0
    plain_s = 0.0

    def _begin_confirm(self, p: Progress, mean: float, plain_side: bool, plain_first: bool = False) -> SpecConfig:
        """From the decision on, the verdict's top arm runs until it has committed as many tokens
        as max(batch, CONFIRM_MIN_ROWS) rows of `mean` tokens hold; where the sample ran the arm
        (`plain_side`), plain decoding runs a batch's rows' worth of steps instead (at batch 1,
        4 rows of a paying 32-row code shard ran plainly: 0.91x the oracle). Where the sample ran
        another arm (`plain_first`), no plain step of this shard prices the arm: plain decoding
        runs a batch's rows' worth first, its steps the anchor (`_reanchor`), then the arm."""
        self.phase = "confirm"
        self._mark(p)
        self.plain_side, self.plain_first, self.fresh, self.mean = plain_side, plain_first and not plain_side, None, mean
        self.plain_after, self.window, self.plain_s = False, None, 0.0
        if plain_side or self.plain_first:
            self.confirm_tokens = self.batch_size * mean
            return self._run(NO_SPEC)
        self.confirm_tokens = max(self.batch_size, CONFIRM_MIN_ROWS) * mean
        return self._run(self.verdict.top_spec)

    def _anchored_first(self, p: Progress, final: bool) -> SpecConfig | None:
        """The end of `plain_first`'s plain stretch: its steps anchor the profile now, and the arm
        runs from here as a confirmation does (its tokens counted afresh)."""
        steps, delta = p.steps[self.mark[0]:], p.timing - self.mark[1]
        self.plain_first = False
        if not steps or delta.decode_s <= 0 or final:
            why = "the shard ended" if final else "plain decoding ran no decode step"
            self.reason += f"; not confirmed: {why} before {self.verdict.top_spec.label} could be measured against it"
            self.phase, self.since = "watch", len(self.order)
            return self._run(self.verdict.chosen)
        self.plain_s += delta.decode_s
        self.fresh = self.worker.anchor = self._reanchor(delta, steps)  # plain decoding, now
        self._mark(p)
        self.confirm_tokens = max(self.batch_size, CONFIRM_MIN_ROWS) * self.mean
        return self._run(self.verdict.top_spec)

    def _mark(self, p: Progress) -> None:
        """What is measured starts here: steps, timing and rows done now; no token counted yet."""
        self.mark = (len(p.steps), p.timing, len(self.order))
        self.confirm_seen = (len(p.steps), 0)

    def _confirmed_enough(self, p: Progress) -> bool:
        seen, tokens = self.confirm_seen
        tokens += sum(s.committed for s in p.steps[seen:])
        self.confirm_seen = (len(p.steps), tokens)
        return tokens >= self.confirm_tokens

    def _confirm(self, p: Progress, final: bool = False) -> SpecConfig | None:
        """The end of a stretch of the confirmation. After `plain_first`'s, the arm runs
        (`_anchored_first`). After the arm's, plain decoding runs as many steps as the arm's
        window did (`plain_after`: as many tokens as its steps held rows; a batch's rows' worth,
        which it first ran, is as many steps as a row has tokens, 512 on long outputs), unless
        the shard ended or has no row left to run them on: the arm is measured when they end
        (`_measure`), against plain decoding before and after it. Where
        the sample itself ran the arm (a key's later shard, `plain_side`), the sample's steps are
        set against plain decoding's steps since the decision, whose anchor is this moment's (an
        anchor of another shard's prices plain decoding at another moment of the machine)."""
        if self.plain_first:
            return self._anchored_first(p, final)
        if self.plain_after:
            return self._after(p, final)
        self._stretch(p)
        v = self.verdict
        steps, delta = p.steps[self.mark[0]:], p.timing - self.mark[1]
        rows = len(self.order) - self.mark[2]
        if self.plain_side:
            if not steps or delta.decode_s <= 0:
                self.phase, self.since = "watch", len(self.order)
                self.reason += "; not confirmed: plain decoding ran no decode step to measure against"
                return self._run(v.chosen)
            self.plain_s += delta.decode_s
            anchor = self.worker.anchor = self._reanchor(delta, steps)  # plain decoding, now
            where = f"decoding the sample, set against plain decoding's {len(steps)} steps after it ({rows} rows finished)"
            return self._measure(p.steps[: self.mark[0]], self.mark[1], self.mark[2], [anchor], where, final)
        before, where = v.anchor, "in the shard's batch"
        if self.fresh is not None:
            before, where = self.fresh, "in the shard's batch, set against plain decoding's steps just before them"
        if final or not (p.queued or p.in_flight):
            why = "the shard ended" if final else "no row was left"
            return self._measure(steps, delta, rows, [before], where, final, alone=why)
        self.window = (steps, delta, rows, before, where)
        self.plain_after = True
        self._mark(p)
        self.confirm_tokens = sum(s.rows for s in steps)  # one token a row in flight per plain step
        return self._run(NO_SPEC)

    def _after(self, p: Progress, final: bool) -> SpecConfig | None:
        """The end of `plain_after`'s plain stretch: its steps anchor the profile now, and the arm's
        window is measured against plain decoding before it and after it (`sandwiched`)."""
        self.plain_after = False
        steps, delta, rows, before, where = self.window
        after, took = p.steps[self.mark[0]:], p.timing - self.mark[1]
        if not after or took.decode_s <= 0:
            return self._measure(steps, delta, rows, [before], where, final,
                                 alone="plain decoding after it ran no decode step")
        self.plain_s += took.decode_s
        now = self.worker.anchor = self._reanchor(took, after)  # plain decoding, now
        return self._measure(steps, delta, rows, [before, now], where, final, after=len(after))

    def _measure(self, steps: list[Step], delta: Timing, rows: int, anchors: list[Anchor], where: str, final: bool,
                 alone: str = "", after: int = 0) -> SpecConfig:
        """The arm's `steps` (taking `delta`, `rows` finished among them) against plain decoding
        priced at the faster of `anchors` (`sandwiched`: the sample's or `plain_first`'s steps
        before them and `after` steps after them, where there are two); settle decides, and the
        watch phase begins. The arm's measured-over-priced ratio is kept for the worker's
        profile only where plain decoding was measured after the steps (`alone` says why not): a
        window set against the sample's anchor alone can be a slowed sample's, not the arm's.
        Where the two stand more than DISTURBED apart the machine moved during the measurement:
        the window may still show the arm losing, but what it decides by is at most the sample's
        prediction, and neither its ratio nor the prediction's error against it is kept. Beside
        bursts of CPU work a window whose plain steps were slowed on both sides (2.74x and 3.95x
        its own) measured a losing arm at 2.74x, and the shard ran it at 0.95x."""
        self.phase, self.since = "watch", len(self.order)
        v = self.verdict
        arm_s = delta.decode_s
        profile = self.worker.profile
        anchor, plain_s, prices = sandwiched(steps, anchors, profile)
        if not steps or arm_s <= 0 or plain_s <= 0:
            self.reason += f"; not confirmed: {v.top_spec.label} ran no decode step to measure"
            return self._run(v.chosen)
        if anchor is not anchors[-1] and hasattr(self.watch, "anchor"):  # the drift window prices as this did
            self.watch.anchor = self.worker.anchor = anchor
        window = plain_s / arm_s
        priced = arm_price_s(steps, v.top_spec, anchor, profile, v.lookup_s)
        ratio = (delta.decode_s - delta.admit_s) / priced if priced > 0 else 1.0  # measured over priced
        predicted = v.top.predicted_speedup
        speedup, which = confirmed_speedup(predicted, ratio, window)
        apart = max(prices) / min(prices) - 1 if min(prices) > 0 else 0.0
        disturbed = apart > DISTURBED
        keep = not alone and not disturbed
        if disturbed:
            if predicted and predicted < speedup:
                speedup, which = predicted, f"{which}; the sample's {predicted:.2f}x decides"
            which = (f"plain decoding's two prices {apart:.0%} apart, more than {DISTURBED:.0%}: the machine moved "
                     f"while the window was measured, so it can lower the sample's prediction, not raise it; {which}")
        # the arm's steps are priced at what they measure on this worker from now on (the
        # prediction's error is kept as it was made: the next shards allow for the profile's own)
        now = profile.arm_measured(v.top_spec.method, v.top_spec.draft_model, ratio) if priced > 0 and keep else \
            profile.arm_scale(v.top_spec.method, v.top_spec.draft_model)
        tokens = sum(s.committed for s in steps)
        v.top.speedup, v.top.measured, v.top.decode_tokens, v.top.tokens_per_s = speedup, True, tokens, tokens / arm_s
        self.confirmed = True
        both = ""
        if len(prices) == 2:
            both = (f"; plain decoding's steps before them price them at {prices[0] / arm_s:.2f}x, its {after} steps "
                    f"after them at {prices[1] / arm_s:.2f}x: the faster counts")
        chosen, why = settle(v, speedup, None if disturbed else predicted, self.worker, self.key, self.settings,
                             f"at {speedup:.2f}x plain decoding: its {len(steps)} steps {where} ({tokens} "
                             f"tokens, {rows} rows finished{', the shard ended' if final else ''}) took "
                             f"{ratio:.2f}x the profile's price{both}; {which}"
                             + (f"; not measured after them ({alone}): the ratio not kept" if alone else ""))
        self.reason += why
        if chosen is NO_SPEC:  # the rows are kept, but the arm took longer than plain decoding would have
            self.lost_s = max(0.0, arm_s - plain_s)
            if predicted and hasattr(self.watch, "discount"):  # the window's price overrated it as the sample's did
                # (against the prediction as the profile now prices it: the ratio is in both)
                self.watch.discount[v.top_spec.label] = speedup / (predicted * now)
        elif speedup > 1.0:  # the plain stretches it ran to measure against took longer than the arm would have
            self.lost_s = self.plain_s * (1.0 - 1.0 / speedup)
        return self._run(chosen)
