"""The running arm's own steps, for calibration in flight (batchspec.calibrate.inflight): the
stretches each speculative setting ran between drift checks with their measured time, what they
measured against the profile's price (the drift fallback's second witness), and the probe of plain
decoding where that witness and the profile disagree on an anchor from another moment.

`ArmSteps` is `InFlight`'s part that keeps them; it reads the control's state (`watch`, `worker`,
`verdict`, `order`, `drift`, `reason`, `watched`, `_every`, `_window`) and nothing else uses it.
"""

from __future__ import annotations

from batchspec.calibrate.pricing import Anchor, anchor_of_steps, arm_price_s, plain_price_s
from batchspec.engine.base import NO_SPEC, Progress, SpecConfig, Step, Timing


class ArmSteps:
    """The stretches the running arm ran (`ran`), their measured-over-priced ratio, and the probe."""

    def _stretch(self, p: Progress) -> None:
        """Keep the steps run under a speculative setting since the last mark, with their measured
        decode time (a draft model's prefills apart: not priced), for `_ratio`."""
        steps = p.steps[self.watched_steps:]
        if p.spec.method != "none" and steps:
            t = p.timing - self.watched
            self.ran = [*self.ran[-31:], (p.spec, list(steps), t.decode_s - t.admit_s)]

    def _ratio(self, spec: SpecConfig) -> float | None:
        """How the steps `spec` ran lately (the stretches since it last took over, about a window's
        rows of them) measured against the profile's price of them at the window's anchor: the
        profile's error on this arm as the machine is now (drift.while_speculating). None where
        nothing was priced."""
        anchor, profile = getattr(self.watch, "anchor", None), self.worker.profile
        if anchor is None or not profile.points:
            return None
        recent = self._recent(spec)
        lookup = self.verdict.lookup_s if self.verdict is not None else 0.0
        priced = sum(arm_price_s(steps, spec, anchor, profile, lookup) for steps, _ in recent)
        measured = sum(m for _, m in recent)
        return measured / priced if priced > 0 and measured > 0 else None

    def _recent(self, spec: SpecConfig) -> list[tuple[list[Step], float]]:
        """The stretches `spec` ran since it last took over, the last window's rows of them at most."""
        recent = []
        for ran, steps, measured in reversed(self.ran):
            if ran.label != spec.label or len(recent) * self._every() >= self._window():
                break
            recent.append((steps, measured))
        return recent

    def _disagree(self, spec: SpecConfig, running: float | None, ratio: float | None) -> bool:
        """The profile's prediction for the running arm on the window (`running`) and the arm's own
        steps (the prediction over `ratio`, `_ratio`) fall on either side of plain decoding, the
        steps a window's rows of them: at batch 8 one stretch of 20 steps measured 1.22x plain for
        an arm the whole shard measured at 0.95x, and 12 steps 0.85x."""
        if running is None or not ratio or len(self._recent(spec)) * self._every() < self._window():
            return False
        return (running < 1.0) != (running / ratio < 1.0)

    def _stale(self) -> bool:
        """The anchor the arm's steps are measured against is not this shard's plain steps of the
        last window: a key's later shard decoded its sample under the arm (the worker's anchor,
        another shard's), or plain decoding last ran a window ago."""
        return self.anchored_at is None or len(self.order) - self.anchored_at >= self._window()

    def _probed(self, p: Progress) -> SpecConfig | None:
        """The end of a probe: where the profile and the running arm's own steps disagreed whether
        it pays (`_disagree`) on an anchor from another moment (`_stale`), plain decoding ran a
        batch's worth of rows, and its steps anchor the profile afresh (the machine as it is now:
        on this CPU plain decoding swung 82-157 tok/s between shards of one run). Those steps'
        anchor prices the tokens the arm's last steps committed as plain decoding would have run
        them, over the arm's measured time: below 1.0 the rows stay under plain decoding and the
        arm's predictions on this shard are scaled by what it measured (DriftWatch.discount, so the
        window does not switch it on again on the price that overrated it); else the arm resumes.
        The probe's rows are kept, as every row is; what it costs is their speedup."""
        arm, at, then, row, running = self.probe
        self.probe = None
        steps, delta = p.steps[at:], p.timing - then
        self.watched, self.watched_steps = p.timing, len(p.steps)
        profile = self.worker.profile
        recent = self._recent(arm)
        if not steps or delta.decode_s <= 0 or not recent:
            return arm
        fresh = self._reanchor(delta, steps)
        arm_s = sum(m for _, m in recent)
        measured = sum(plain_price_s(s, fresh, profile) for s, _ in recent) / arm_s if arm_s > 0 else 1.0
        said = (f"; at row {row} the profile predicted {arm.label} at {running:.2f}x on the window and its own steps "
                f"disagreed: plain decoding ran {len(self.order) - row} rows ({len(steps)} steps) to measure against, "
                f"and the arm's last {sum(len(s) for s, _ in recent)} steps measured {measured:.2f}x plain")
        if measured < 1.0:
            self.reason += said + ", so plain decoding goes on"
            self.drift.record(row, arm, NO_SPEC)
            self.watch.discount[arm.label] = measured / running if running else 1.0
            self.calibrated = None
            return None
        self.reason += said + f", so {arm.label} resumes"
        return arm

    def _reanchor(self, delta: Timing, steps) -> Anchor:
        """Plain decoding's `steps` (taking `delta`) measured now: the profile's anchor for the
        drift window from here on, and the row it was taken at (`_stale`)."""
        fresh = anchor_of_steps(delta, steps, self.worker.profile)
        if hasattr(self.watch, "anchor"):
            self.watch.anchor = fresh
        self.anchored_at = len(self.order)
        return fresh
