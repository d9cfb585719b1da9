"""The confirmation of calibration in flight (batchspec.calibrate.inflight, its "confirm" phase):
where calibration wants a measurement, the arm it chose runs on from the decision, and once it has
committed a few sample rows' worth of tokens its steps are set against plain decoding's price of
the same tokens (`confirmed_speedup`), and counterfactual.settle decides.

`Confirming` is `InFlight`'s part that keeps the confirmation's bookkeeping (where it began, what it
waits for, which side it measures); it reads the control's state (`verdict`, `worker`, `key`,
`settings`, `order`, `watch`, `batch_size`, `_run`, `_stretch`, `_reanchor`), sets its phase's
outcome (`phase`, `since`, `reason`, `confirmed`, `lost_s`), and nothing else uses it.
"""

from __future__ import annotations

from batchspec.calibrate.counterfactual import CONFIRM_MIN_ROWS, settle
from batchspec.calibrate.pricing import arm_price_s, plain_price_s
from batchspec.engine.base import NO_SPEC, Progress, SpecConfig


def confirmed_speedup(predicted: float, ratio: float, window: float) -> tuple[float, str]:
    """What a confirmation in flight decides by: the lower of the sample's `predicted` speedup
    corrected by `ratio` (the arm's steps' measured time over the profile's price of them) and
    the `window`'s own measured speedup, with the reason's words for it."""
    corrected = predicted / ratio
    if window < corrected:
        return window, f"those steps alone measured {window:.2f}x, below the sample's {predicted:.2f}x corrected ({corrected:.2f}x)"
    return corrected, f"the sample's {predicted:.2f}x corrected (those steps alone measured {window:.2f}x)"


class Confirming:
    """Where the confirmation began (`mark`: steps, timing, rows done), the tokens it waits for
    (`confirm_tokens`, counted in `confirm_seen`), whether it measures plain decoding
    (`plain_side`: the sample itself ran the arm), and whether plain decoding runs first to price
    the arm against (`plain_first`: the sample ran another arm) and the anchor it gave (`fresh`)."""

    mark = None
    confirm_tokens = 0.0
    confirm_seen = (0, 0)
    plain_side = False
    plain_first = False
    fresh = None
    mean = 0.0

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
        """The confirmation's measurement: the arm's steps since the decision, against plain
        decoding priced at the sample's anchor; or, where the sample itself ran the arm (a key's
        later shard, `plain_side`), the sample's steps against plain decoding's steps since the
        decision, whose anchor is this moment's. Before that (until 2026-12-03) such a shard ran the
        arm again and priced plain decoding at the worker's anchor, another shard's: a later prose
        shard at batch 1 confirmed k=2 at 0.77x (its steps 1.31x the price) where the whole shard
        measured it at 1.16x."""
        if self.plain_first:
            return self._anchored_first(p, final)
        self._stretch(p)
        v = self.verdict
        anchor, where = v.anchor, "in the shard's batch"
        if self.fresh is not None:
            anchor, where = self.fresh, "in the shard's batch, set against plain decoding's steps just before them"
        steps, delta = p.steps[self.mark[0]:], p.timing - self.mark[1]
        self.phase, self.since = "watch", len(self.order)
        rows = len(self.order) - self.mark[2]
        if self.plain_side:
            if not steps or delta.decode_s <= 0:
                self.reason += "; not confirmed: plain decoding ran no decode step to measure against"
                return self._run(v.chosen)
            anchor = self.worker.anchor = self._reanchor(delta, steps)  # plain decoding, now
            where = f"decoding the sample, set against plain decoding's {len(steps)} steps after it ({rows} rows finished)"
            steps, delta, rows = p.steps[: self.mark[0]], self.mark[1], self.mark[2]
        arm_s = delta.decode_s
        plain_s = plain_price_s(steps, anchor, self.worker.profile)
        if not steps or arm_s <= 0 or plain_s <= 0:
            self.reason += f"; not confirmed: {v.top_spec.label} ran no decode step to measure"
            return self._run(v.chosen)
        window = plain_s / arm_s
        priced = arm_price_s(steps, v.top_spec, anchor, self.worker.profile, v.lookup_s)
        ratio = (delta.decode_s - delta.admit_s) / priced if priced > 0 else 1.0  # measured over priced
        predicted = v.top.predicted_speedup
        speedup, which = confirmed_speedup(predicted, ratio, window)
        # the arm's steps are priced at what they measure on this worker from now on (the
        # prediction's error is kept as it was made: the next shards allow for the profile's own)
        now = self.worker.profile.arm_measured(v.top_spec.method, v.top_spec.draft_model, ratio) if priced > 0 else 1.0
        tokens = sum(s.committed for s in steps)
        v.top.speedup, v.top.measured, v.top.decode_tokens, v.top.tokens_per_s = speedup, True, tokens, tokens / arm_s
        self.confirmed = True
        chosen, why = settle(v, speedup, predicted, self.worker, self.key, self.settings,
                             f"at {speedup:.2f}x plain decoding: its {len(steps)} steps {where} ({tokens} "
                             f"tokens, {rows} rows finished{', the shard ended' if final else ''}) took {ratio:.2f}x the "
                             f"profile's price; {which}")
        self.reason += why
        if chosen is NO_SPEC:  # the rows are kept, but the arm took longer than plain decoding would have
            self.lost_s = max(0.0, arm_s - plain_s)
            if predicted and hasattr(self.watch, "discount"):  # the window's price overrated it as the sample's did
                # (against the prediction as the profile now prices it: the ratio is in both)
                self.watch.discount[v.top_spec.label] = speedup / (predicted * now)
        return self._run(chosen)
