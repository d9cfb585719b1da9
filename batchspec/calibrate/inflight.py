"""Calibration in flight: a shard is one continuous batch, and its calibration rides inside it.

Where the engine can change its setting between decode steps (`in_flight_control`: the torch
engine) and every arm's acceptance can be computed (counterfactual.counterfactual_ready), a shard
is one generate call under `InFlight`, the call's control (engine.base.Control):

    sample   the sample rows (decision.sample_indices: evenly spaced) are admitted first and
             decode plainly in the shard's own batch, the shard's other rows joining as they
             finish: nothing drains and nothing runs twice. A key's later shard on the worker
             decodes them under the setting its last shard ended under (`InFlight._start`):
             greedy speculation commits plain decoding's tokens, so the counterfactual is the
             same, plain decoding's time is priced from the profile at the anchor of the
             worker's last plain sample (`as_plain`), and a paying key's sample no longer runs
             at plain speed on every shard. When every sample row has finished
             or reached the calibration cap (`max_tokens`), their plain tokens give every arm's
             counterfactual acceptance, the steps the call ran tie the profile's prices to the
             machine as it is now (`anchor_of_steps`), and counterfactual.predict_sample chooses:
             the rows in flight and those queued go on under the choice. A key's later shard
             predicts on its sample's rows and the key's last rows on this worker (64, or a drift
             window where that is more: `_remember`, pricing.KeyHistory, their counterfactual
             already computed by its drift checks): the sample is one batch, and on the 128-row code shard at batch 8 its 8 rows
             put n-gram k=8 at 1.32x where the whole shard measured 0.76x; in four runs the sample's
             prediction of every arm was 1.3-2.4x the same price on the whole shard's acceptance
             (a sample is streamed as distinct rows, `pricing.streamed`, not as copies of one).
    confirm  where calibration wants a measurement (a key's first shard choosing an arm, or a
             prediction within its error of the margin) the best arm runs on from there. Once
             it has committed as many tokens as max(batch, 4) sample rows hold, two figures are
             set side by side (confirm.confirmed_speedup): the sample's predicted speedup corrected by
             how far the profile's price of the very steps the arm ran was from their measured
             time (the cost model's error for this arm on this machine), and those steps' own
             speedup (plain decoding's price for the tokens they committed over their measured
             time: the acceptance of rows that are not the sample's). The lower decides
             (counterfactual.settle). Either alone was seen wrong: on `make run`'s edit shard 13
             steps measured 1.20x for an arm that ran the shard at 1.0x; on a 128-row code shard
             the corrected prediction said 1.20x where
             22 steps measured 0.72x, and the shard under the arm took 1.09x the wall time of the same
             shard calibrated apart, which chose none. Plain decoding's price of those steps is
             measured on both sides of them: the sample's steps before (or a batch's rows' worth
             of plain steps, where the sample ran another arm) and as many steps after,
             the faster counting (confirm.sandwiched): on a fast model the arm's window is about
             20 steps, a tenth of a second, and against a sample that ran slow a losing arm
             measured 1.15x and ran the rest of its shard at 0.78x plain.
    watch    the drift checks (drift.Drift.after_chunk) set what the next rows run under, both
             ways, after every batch's worth of finished rows (at least 4), on the last chunk's
             worth finished (drift_chunk, or 8 x batch; at least 16), sample rows included; on a
             key's later shard the key's last rows on the worker fill that window while the
             shard's own rows do not (drift.history_rows), as they fill the sample's prediction.
             A check waits, too, until the shard has decoded for its cost over `drift_share` since
             the last (`_affords`: a check's cost is what the worker's checks took, on the mean):
             a check prices every arm over its window in Python, a few to tens of milliseconds
             whatever the engine, and on a fast step it was most of the decode (a 6M-parameter
             model at batch 8, 3.7 ms a step: 0.13-0.45 s of checks in a 64-row shard's 0.7 s).
             The sample is one batch, and a check per chunk of new rows came too late to mend it
             (at batch 8 a 64-row edit shard chose none from 8 rows predicting 0.94x for an
             arm that measured 1.14x, and was never checked again; a 128-row code shard chose
             n-gram k=6 predicting 1.58x where the whole shard measured 1.03x, k=2 1.14x). While
             an arm runs, its steps since it took over (about a window's rows of them) are
             measured against the profile's price (`_ratio`), and a fallback needs those steps to
             show the loss too: the profile alone sent a paying edit shard to plain decoding for
             half its rows (drift.while_speculating).
             Where the two fall on either side of plain decoding and the anchor is not this shard's
             last window's, plain decoding runs a batch's worth of rows to anchor the profile afresh,
             and the arm's steps measured against it decide (`_probed`): the key's later code
             shard at batch 8 ran n-gram k=2 over all its rows at 0.94x plain, the profile saying 1.11x.

The sample decoded apart (`calibration: {in_flight: false}`) is a generate call of its own,
drained as its rows finish, then the confirmation another, then each chunk: on `make run`'s 64-row
shards that sample alone was 12-15% of a shard's time. In flight, what calibration costs is the
control's own time (prediction, profile); the sample's decoding is the shard's, at the shard's
batch size. The drain this removes costs most where outputs vary in length and a half-empty batch
costs what a full one does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from batchspec.calibrate.counterfactual import (
    CONFIRM_MIN_ROWS,
    Verdict,
    WorkerCalibration,
    predict_sample,
)
from batchspec.calibrate.confirm import Confirming
from batchspec.calibrate.decision import CalibrationSettings, Decision, sample_indices
from batchspec.calibrate.drift import Drift, DriftWatch
from batchspec.calibrate.probe import ArmSteps
from batchspec.calibrate.profiling import PROFILE_SHARE, shape_of, shard_decode_s
from batchspec.calibrate.pricing import (
    Anchor,
    KeyHistory,
    RowCounterfactuals,
    anchor_of_steps,
    as_plain,
    completions_so_far,
    keyed_plain_rows,
    rows_in_flight,
)
from batchspec.engine.base import NO_SPEC, GenerateResult, Progress, Request, SpecConfig, Step, Timing
from batchspec.predict.acceptance import PlainRow
from batchspec.predict.cost import TIMINGS_KEPT, CostProfile


def drift_chunk(settings: CalibrationSettings, batch_size: int) -> int:
    """Rows a generate call is priced as running at once in flight: `drift_chunk`, or 8 x batch."""
    return settings.drift_chunk or 8 * batch_size


def drift_every(settings: CalibrationSettings, batch_size: int) -> int:
    """Rows finished between drift checks: a batch's worth (at least CONFIRM_MIN_ROWS, at most
    a chunk), each check on the last `drift_window` rows finished, so what the sample misjudged
    (a gain it missed, an arm it overrated, a draft length) is seen from the rows that follow
    it, without waiting for a whole chunk. Also a key's later shard's sample (`_sample_size`)."""
    return min(drift_chunk(settings, batch_size), max(batch_size, CONFIRM_MIN_ROWS))


def drift_window(settings: CalibrationSettings, batch_size: int) -> int:
    """Rows a drift check predicts on: a chunk, and at least 16 unless drift_chunk is set."""
    return settings.drift_chunk or max(16, drift_chunk(settings, batch_size))


@dataclass
class InFlight(ArmSteps, Confirming):
    """The control of a shard's one generate call: calibrates on its sample, confirms, watches
    for drift. `close` turns what it saw into the shard's Decision, each row's setting and the
    Drift record."""

    engine: object
    requests: Sequence[Request]
    arms: list[SpecConfig]  # the speculative arms
    batch_size: int
    settings: CalibrationSettings
    worker: WorkerCalibration
    key: str | None = None
    shard_id: str | None = None
    clock: Callable[[], float] = time.perf_counter
    first: list[int] = field(init=False)  # the sample: engine.base.Control.first
    drift: Drift = field(default_factory=Drift, init=False)
    spent_s: float = field(default=0.0, init=False)  # the control's own seconds deciding: prediction, profile
    watch_s: float = field(default=0.0, init=False)  # ... and watching for drift (decode-time work of the shard, as in shard._watch)
    lost_s: float = field(default=0.0, init=False)  # decode time a confirmed-losing arm took beyond plain's

    def __post_init__(self) -> None:
        self.first = sample_indices(len(self.requests), self._sample_size())
        self.phase = "sample"  # -> "confirm" -> "watch"
        self.verdict: Verdict | None = None
        self.reason = ""
        self.confirmed = False
        self.made_by: dict[int, SpecConfig] = {}  # request index -> the setting its last step ran under
        self.order: list[int] = []  # request indices in the order they finished
        self.since = 0  # rows done at the last drift check
        self.checked_at = 0.0  # the call's decode seconds at the last drift check (`_affords`)
        self.calibrated: float | None = None  # the running arm's acceptance rate, the drift fallback's yardstick
        self.last: Progress | None = None
        self.watched = Timing()  # the call's timing at the last drift check (or change of setting) ...
        self.watched_steps = 0  # ... and its steps then
        self.ran: list[tuple[SpecConfig, list[Step], float]] = []  # speculative stretches: setting, steps, measured s
        self.anchored_at: int | None = None  # rows done when this shard last measured plain decoding's steps
        self.probe: tuple[SpecConfig, int, Timing, int, float] | None = None  # arm, steps, timing, rows, its prediction
        self.chosen: SpecConfig = NO_SPEC
        self.start = self._start()  # what the sample decodes under: the call's first setting
        self.current = self.start  # the setting the rows in flight decode under
        self.watch = DriftWatch(self.engine, self.arms, self.worker, self.batch_size, self.settings.margin)

    # -- engine.base.Control ----------------------------------------------------------------------

    def __call__(self, p: Progress) -> SpecConfig | None:
        began = self.clock()
        self.last = p
        for i in p.done:
            self.made_by[i] = p.spec
        self.order += p.done
        new = None
        if self.phase == "sample" and self._sample_done(p):
            new = self._decide(p)
        elif self.phase == "confirm" and self._confirmed_enough(p):
            new = self._confirm(p)
        elif self.phase == "watch" and len(self.order) - self.since >= self._every() and (p.queued or p.in_flight) \
                and self._affords(p):
            new = self._watch(p)
            took = self.clock() - began
            self.watch_s += took
            self.worker.checked(took)
            self.checked_at = p.timing.decode_s
            self.current = new or p.spec
            return new
        self.spent_s += self.clock() - began
        self.current = new or p.spec
        return new

    def _sample_size(self) -> int:
        """Rows in the sample: `CalibrationSettings.sample_rows`, unless the key's last rows
        on this worker (pricing.KeyHistory), at least as many, is there to predict on beside it (a
        key's later shard): then one drift check's worth (`_every`: a batch, at least
        CONFIRM_MIN_ROWS), as a drift check predicts on the last window with that many rows new in
        it; the prediction rests on no fewer rows than the whole sample gave it. The sample decodes
        under the key's last setting before anything is decided, and its share of a small shard is
        what a changed workload costs there: a sample of a quarter of a small shard run under the
        key's last arm, where another paid more, costs that quarter's difference. A sample size
        the pipeline file sets is kept."""
        rows = self.settings.sample_rows(self.batch_size, counterfactual=True)
        history = self.worker.history.get(self.key) if self.key is not None else None
        if self.settings.sample_size or history is None or len(history.rows) < rows:
            return rows
        return min(rows, self._every())

    def _affords(self, p: Progress) -> bool:
        """Whether a drift check's cost, the mean of the worker's checks so far, is within
        `drift_share` of the decode time since the last check (or since the call began); a share
        of 1 checks after every batch's worth of rows, whatever a check costs."""
        cost, share = self.worker.check_s(), self.settings.drift_share
        return cost is None or share >= 1 or cost <= share * (p.timing.decode_s - self.checked_at)

    def _start(self) -> SpecConfig:
        """The setting the sample decodes under: the key's last on this worker (`settled`) where that
        was an arm still among this shard's and the worker can price a run under it (a profile, a
        plain run's bookkeeping); else "none". Greedy speculation commits plain decoding's tokens, so
        the counterfactual on the sample is the same; what changes is that a key whose shards pay
        does not run its sample (a batch of rows: 1/8 to 1/4 of the bench's shards) at plain speed
        on every shard: the sample's share of a shard delivers 1/speedup of the oracle there."""
        spec = self.worker.settled.get(self.key, NO_SPEC)
        if spec.method == "none" or self.worker.anchor is None or not self.worker.profile.points:
            return NO_SPEC
        return next((a for a in self.arms if a.label == spec.label), NO_SPEC)

    def _sample_done(self, p: Progress) -> bool:
        cap = self.settings.max_tokens
        return all(p.completions[i] is not None or len(p.in_flight.get(i, ())) >= cap for i in self.first)

    def _chunk(self) -> int:
        return drift_chunk(self.settings, self.batch_size)

    def _every(self) -> int:
        return drift_every(self.settings, self.batch_size)

    def _window(self) -> int:
        return drift_window(self.settings, self.batch_size)

    # -- the phases -------------------------------------------------------------------------------

    def _decide(self, p: Progress) -> SpecConfig | None:
        self._stretch(p)
        rows, sample = rows_in_flight(self.engine, self.requests, self.first, p)
        plain = GenerateResult(sample + completions_so_far(self.requests, p, exclude=self.first), p.timing)  # every row so far
        steps = list(p.steps)
        start, worker = self.start, self.worker

        def anchor_of(profile: CostProfile) -> Anchor:
            return anchor_of_steps(p.timing, steps, profile, self.batch_size) if start.method == "none" else worker.anchor

        if start.method != "none":  # the rows so far ran under the key's last setting: priced as plain decoding
            plain = as_plain(plain, steps, worker.anchor, worker.profile)
        left = p.queued + len(p.in_flight)
        mean = sum(len(r.output_ids) for r in rows) / len(rows) if rows else 0.0  # tokens a row has, as the sample says
        to_go = p.queued * mean + sum(max(0.0, mean - len(out)) for out in p.in_flight.values())
        rest = plain.timing.decode_s / plain.decode_tokens * to_go if plain.decode_tokens else None
        stream = min(left, self._chunk())
        longest = max(r.params.max_tokens for r in self.requests)
        history = self.worker.history.get(self.key) if self.key is not None else None
        shard_s = shard_decode_s(plain, rest) or plain.timing.decode_s  # the sample's alone where it is the shard
        retimed = self._retime(rows, history, longest, shard_s) if start.method == "none" and history is not None \
            else (0.0, 0)
        v = self.verdict = predict_sample(self.engine, rows, plain, rest, longest, self.arms,
                                          self.batch_size, self.settings, self.worker, self.key, stream, anchor_of,
                                          history, running=start)
        under = ""
        if retimed[1]:
            v.profile_s += retimed[0]
            v.reason += (f"; the production batch's width curve timed again first ({retimed[1]} points, "
                         f"{retimed[0]:.1f} s, within {PROFILE_SHARE:.0%} of the worker's decode time): each point "
                         f"priced at the mean of its last {TIMINGS_KEPT} timings")
        if start.method != "none":
            base = v.arms[0]  # plain decoding did not run: its figure is the profile's price
            base.measured, base.predicted_tokens_per_s, base.tokens_per_s, base.predicted_speedup = \
                False, base.tokens_per_s, None, 1.0
            under = (f" under {start.label}, the setting the key's last shard on this worker ended under (greedy "
                     f"speculation commits plain decoding's tokens; plain decoding's time priced from the profile)")
        anchor = v.anchor
        if anchor is None and steps and worker.profile.points:  # no arm priced (profiling could not repay): the
            anchor = anchor_of(worker.profile)                  # steps still tie the worker's profile to this run
        if start.method == "none" and anchor is not None:
            worker.anchor, self.anchored_at = anchor, len(self.order)
        self.reason = v.reason + f"; the sample decoded in the shard's batch{under} ({len(self.order)} rows done, {left} to go)"
        if history is not None and rows and v.arms[1:]:
            self.reason += (f"; predicted on its {len(rows)} rows and the key's last {len(history.rows)} rows on this "
                            f"worker (its last shards')")
        if isinstance(self.watch, DriftWatch):  # the window's checks price as the sample's prediction did, and
            self.watch.anchor, self.watch.stream = anchor, self._chunk()  # take in the key's last rows on the
            self.watch.history, self.watch.window = history, self._window()  # worker while the shard's do not fill it
        self.since = len(self.order)
        if v.wanted and left:
            return self._begin_confirm(p, mean, plain_side=start.method != "none" and v.top_spec.label == start.label
                                       and bool(steps), plain_first=start.method != "none")
        if v.wanted:
            self.reason += "; not confirmed: no other rows of the shard to confirm on"
        self.phase = "watch"
        return self._run(v.chosen)

    def _retime(self, rows: Sequence[PlainRow], history: KeyHistory | None, longest: int,
                shard_s: float) -> tuple[float, int]:
        """The width curve that prices this shard, timed again where the worker's budget for it
        allows (profiling.retime_curve) and its expected cost is within PROFILE_SHARE of the shard's
        own plain decode time (`shard_s`): a shard does not pay for its worker's others (at batch 8 on
        held-out 64-row shards a re-time took 2.7 s, 5.9% of the shard that ran it, within a worker
        budget of about 5 s; a shard of 1,000 rows takes it within 2%). Only on a key's later shard, whose decision rests on the
        prediction (a key's first shard on the worker confirms a speculative choice by measuring
        it; `make run`'s shards are all first shards, and a re-time there, 1-2 s at batch 8, would
        be 5-10% of a shard against its 5% target), and only where the sample decoded plainly: its
        steps anchor the new prices, where a sample under an arm prices plain decoding at the
        worker's last anchor, taken on the old ones. Returns the seconds and the points re-timed."""
        if not rows or not self.arms or not self.worker.profile.points:
            return 0.0, 0
        shape = shape_of([*rows, *(history.rows if history is not None else ())], self.arms, self.batch_size, longest)
        if not self.worker.profile.covers(*shape):
            return 0.0, 0  # predict_sample measures what it lacks
        return self.worker.retime(self.engine, shape, rows[0].temperature, shard_s)

    def _watch(self, p: Progress) -> SpecConfig | None:
        part = self.order[-self._window():]  # greedy rows are plain decoding's whichever setting made them
        self.since = len(self.order)
        result = GenerateResult([p.completions[i] for i in part], p.timing - self.watched)
        self._stretch(p)
        if self.probe is not None:
            return self._probed(p)
        self.watched, self.watched_steps = p.timing, len(p.steps)
        ratio = self._ratio(p.spec)
        if isinstance(self.watch, DriftWatch):
            self.watch.ratio = ratio
        spec, self.calibrated = self.drift.after_chunk(len(self.order), p.spec, self.calibrated,
                                                       [self.requests[i] for i in part], result, self.watch,
                                                       self.settings.drift_ratio)
        running = getattr(self.watch, "running", None)
        if spec == p.spec and spec.method != "none" and self._disagree(spec, running, ratio) and self._stale():
            self.probe = (spec, len(p.steps), p.timing, len(self.order), running)
            return NO_SPEC
        return spec if spec != p.spec else None

    def _run(self, spec: SpecConfig) -> SpecConfig:
        """Calibration's setting from here on, its acceptance the fallback's yardstick."""
        arm = next((a for a in self.verdict.arms if a.label == spec.label), None) if spec is not NO_SPEC else None
        self.chosen, self.calibrated = spec, arm.acceptance_rate if arm is not None else None
        self.watched = self.last.timing if self.last is not None else Timing()
        self.watched_steps = len(self.last.steps) if self.last is not None else 0
        return spec

    # -- the record -------------------------------------------------------------------------------

    def close(self, result: GenerateResult) -> tuple[Decision, list[SpecConfig]]:
        """After the call: the Decision (decided at the end where the sample never gave the control
        a step to decide at), and the setting each row's last step ran under, in request order."""
        began = self.clock()
        if self.phase == "sample":
            final = self.last or Progress(NO_SPEC, [], list(result.completions), {}, 0, result.timing, [])
            self.current = self._decide(Progress(final.spec, [], list(result.completions), {}, 0, result.timing, final.steps))
        elif self.phase == "confirm":
            self.current = self._confirm(Progress(self.last.spec, [], list(result.completions), {}, 0, result.timing, self.last.steps), final=True)
        self._remember(result)
        self.worker.decoded_s += result.timing.decode_s
        self.spent_s += self.clock() - began
        self.worker.settled[self.key] = self.probe[0] if self.probe is not None else self.current
        v = self.verdict
        decision = Decision(
            chosen=self.chosen, arms=v.arms, baseline_tokens_per_s=v.arms[0].tokens_per_s,
            calibration_s=self.spent_s + self.lost_s,
            overhead_s=self.spent_s + self.lost_s, reason=self.reason, shard_id=self.shard_id,
            profile_s=v.profile_s, confirmed=self.confirmed, profile=list(self.worker.profile.points),
        )
        return decision, [self.made_by.get(i, NO_SPEC) for i in range(len(self.requests))]

    def _remember(self, result: GenerateResult) -> None:
        """The key's last rows on this worker for its next shard (`KeyHistory`): its last
        HISTORY_ROWS finished (a drift window where that is more), this shard's after the key's
        earlier ones, with the counterfactual the drift checks computed on them."""
        if self.key is None:
            return
        kept = KeyHistory.size(self._window())
        part = [i for i in self.order[-kept:] if result.completions[i] is not None]
        keyed = keyed_plain_rows(self.engine, [self.requests[i] for i in part],
                                 GenerateResult([result.completions[i] for i in part], Timing()))
        if not keyed:
            return
        keys = [k for k, _ in keyed]
        seen = getattr(self.watch, "cache", None) or RowCounterfactuals(self.engine)  # a scripted watch has none
        mine = KeyHistory(keys, [r for _, r in keyed], seen.kept(keys))
        before = self.worker.history.get(self.key)
        self.worker.remember(self.key, before.then(mine, kept) if before is not None else mine)
