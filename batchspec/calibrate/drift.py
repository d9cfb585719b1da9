"""Drift checks on the chunks a shard generates (shard.py calls them after each chunk), from the
chunk's own counterfactual acceptance priced as calibration prices a sample
(batchspec.calibrate.counterfactual):

- `switch_on` under "none": the rows just generated plainly; an arm that would have beaten plain
  decoding on them by the margin takes over.
- `while_speculating`: the rows the running arm generated are plain decoding's too (greedy
  speculation is lossless), so every arm's counterfactual on them is exact; a predicted loss sends
  the shard back to plain decoding, a faster draft length takes over.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

from batchspec.calibrate.worker import WorkerCalibration
from batchspec.calibrate.decision import best, choose_predicted, predicted_speedups, takes_over
from batchspec.calibrate.pricing import (
    HISTORY_ROWS,
    Anchor,
    KeyHistory,
    RowCounterfactuals,
    _counterfactual,
    keyed_plain_rows,
    predict_arms,
)
from batchspec.engine.base import NO_SPEC, GenerateResult, Request, SpecConfig
from batchspec.stats import ArmResult


def _predict_chunk(engine, rows_done: Sequence[Request], result: GenerateResult, arms: Sequence[SpecConfig],
                   worker: WorkerCalibration, batch_size: int, greedy_only: bool = False,
                   anchor: Anchor | None = None, cache: RowCounterfactuals | None = None,
                   stream: int = 0, history: KeyHistory | None = None, window: int = 0) -> list[ArmResult] | None:
    """Drift checks: every arm in `arms` predicted on the rows `result` just generated, anchored on
    that run (or on `anchor`, where the rows are a window whose time is not one run's), each row's
    counterfactual from `cache` where it was computed before, priced as a generate call of `stream`
    rows (0: the rows alone); None without rows, without a profile, or (`greedy_only`) with
    sampled rows. `history` (a key's later shard: its last rows on the worker, pricing.KeyHistory)
    fills a window of `window` rows that the shard's own rows do not yet fill, with its latest
    rows, as the sample's prediction took it in (KeyHistory.beside)."""
    keyed = keyed_plain_rows(engine, rows_done, result)
    rows, keys = [row for _, row in keyed], [k for k, _ in keyed]
    if not rows or not worker.profile.points or greedy_only and not all(r.greedy for r in rows):
        return None
    anchor = anchor or Anchor.of(result, rows, worker.profile, batch_size)
    counter = cache.of(keys, rows, arms) if cache is not None else None
    if history is not None and window > len(rows) and arms:
        rows, counter = history.beside(rows, counter or _counterfactual(engine, rows, arms), arms,
                                       last=window - len(rows), before=True)
    return predict_arms(engine, rows, arms, anchor, worker.profile, batch_size, counter, stream)


def switch_on(engine, rows_done: Sequence[Request], result: GenerateResult, arms: Sequence[SpecConfig],
              worker: WorkerCalibration, batch_size: int, margin: float, discount: dict | None = None,
              **how) -> tuple[SpecConfig | None, ArmResult | None]:
    """Drift under "none": the counterfactual of the rows just generated plainly. Returns the best
    arm and its prediction if its predicted speedup over them beats plain decoding by the margin,
    else (None, None). Free for n-gram lookup; one teacher-forced forward per draft model.

    `discount`: by arm label, what the arm's own steps measured over what was predicted for it on
    this shard (calibrate.inflight: a confirmation or a probe that sent it to plain decoding): its
    prediction is scaled by it, so an arm measured losing is not switched on again by the price
    that overrated it (a 128-row edit shard at batch 8: k=2 confirmed at 0.79x against 1.07x
    predicted, switched on again by the window 14 rows later).

    An arm without a discount (not measured on this shard) is priced for switching on at the
    higher of its price and the points' (`CostProfile.arm_scale` no lower than 1): a scale below 1
    comes from a few confirmations of some 20 steps each, of another shard or another draft
    length, and no confirmation follows a switch. Where the sample's choice turns on that scale,
    calibration confirms it (counterfactual._turned_by); here the switch waits for a window that
    pays at both."""
    results = _predict_chunk(engine, rows_done, result, arms, worker, batch_size, **how)
    if results is None:
        return None, None
    results = _switching_on(results, arms, worker, discount or {})
    spec, _ = choose_predicted(results, arms, margin)
    if spec is NO_SPEC:
        return None, None
    return spec, next(a for a in results if a.label == spec.label)


def _switching_on(results: Sequence[ArmResult], arms: Sequence[SpecConfig], worker: WorkerCalibration,
                  discount: dict) -> list[ArmResult]:
    """Every arm's prediction as a switch on with no confirmation after it weighs it (`switch_on`,
    and `while_speculating` where the running arm loses): an arm measured on this shard at its
    prediction times its `discount`, any other at no more than the points' price
    (`CostProfile.arm_scale` taken at no lower than 1)."""
    scale = {a.label: min(1.0, worker.profile.arm_scale(a.method, a.draft_model)) for a in arms}
    return [replace(a, predicted_speedup=a.predicted_speedup * discount.get(a.label, scale.get(a.label, 1.0)))
            if a.predicted_speedup is not None else a for a in results]


def while_speculating(engine, rows_done: Sequence[Request], result: GenerateResult, spec: SpecConfig,
                      arms: Sequence[SpecConfig], worker: WorkerCalibration, batch_size: int,
                      margin: float, ratio: float | None = None, **how) -> tuple[SpecConfig, ArmResult | None] | None:
    """Drift while speculating, from the rows `spec` just generated: greedy speculation is
    lossless, so their outputs are plain decoding's and every arm's counterfactual on them is
    exact, a chunk's worth of evidence where calibration had a sample's. Returns the setting for
    what follows and its prediction: plain decoding (or the best arm, if one pays by the margin)
    when `spec` is predicted to lose to plain decoding (that arm priced as `switch_on` prices one:
    `_switching_on`); another arm when it is predicted faster
    than `spec` by the margin (a draft length the sample misjudged); else `spec`. None when the
    counterfactual cannot tell (sampled rows, no profile).

    `ratio`: the measured time of the steps `spec` ran lately over the profile's price of them
    (calibrate.inflight measures it). Where given, a loss must be seen by both the profile and
    the arm's own steps (the prediction divided by `ratio`): on a profile that prices the arm's
    width dear, the profile alone can send a paying shard to plain decoding. A change of draft
    length is judged on the profile alone, every arm priced alike."""
    arms = list(arms) if any(a.label == spec.label for a in arms) else [*arms, spec]
    results = _predict_chunk(engine, rows_done, result, arms, worker, batch_size, greedy_only=True, **how)
    if results is None:
        return None
    by_label = {a.label: a for a in results}
    running = by_label[spec.label].predicted_speedup
    if running is None:
        return None
    if max(running, running / ratio if ratio else running) < 1.0:  # another arm takes over as a switch on would
        chosen, _ = choose_predicted(_switching_on(results, arms, worker, {}), arms, margin)
        return chosen, by_label.get(chosen.label)
    top = best(predicted_speedups(results))
    if top is not None and top[0].label != spec.label and takes_over(top[1], running, margin):
        return next(a for a in arms if a.label == top[0].label), top[0]
    return spec, by_label[spec.label]


@dataclass
class DriftWatch:
    """The checks run after each chunk a shard generates (`switch_on` under "none",
    `while_speculating` while speculating), with what they need. Each row's counterfactual is
    computed once (`cache`). In flight (calibrate.inflight) the rows under "none" are a window
    sliding over the shard's finished rows, priced with the sample's `anchor` as a generate call of
    `stream` rows; after a chunk of its own generate call (shard.generate_watching), the chunk as it ran."""

    engine: object
    arms: list[SpecConfig]
    worker: WorkerCalibration
    batch_size: int
    margin: float
    anchor: Anchor | None = None
    stream: int = 0
    ratio: float | None = None  # the running arm's steps lately: measured over priced (set in flight)
    discount: dict = field(default_factory=dict)  # arm label -> measured over predicted (switch_on)
    running: float | None = None  # the last check's predicted speedup of the arm it kept running
    predicted: float | None = None  # the last check's predicted speedup of the setting it chose (Drift.switch_predicted)
    history: KeyHistory | None = None  # a key's later shard in flight: its last rows on the worker ...
    window: int = 0  # ... filling a window of this many rows (KeyHistory.beside)
    cache: RowCounterfactuals = field(init=False)

    def __post_init__(self) -> None:
        self.cache = RowCounterfactuals(self.engine, keep=HISTORY_ROWS)  # rows that left the window, for the key's history

    def _how(self) -> dict:
        return {"anchor": self.anchor, "cache": self.cache, "stream": self.stream, "history": self.history,
                "window": self.window}

    def __call__(self, part: Sequence[Request], result: GenerateResult) -> tuple[SpecConfig | None, float | None]:
        """Under "none": the arm to switch to (or None) and its predicted acceptance rate, the fallback's yardstick."""
        spec, arm = switch_on(self.engine, part, result, self.arms, self.worker, self.batch_size, self.margin,
                              self.discount, **self._how())
        self.predicted = arm.predicted_speedup if arm is not None else None
        return spec, arm.acceptance_rate if arm is not None else None

    def speculating(self, part: Sequence[Request], result: GenerateResult,
                    spec: SpecConfig) -> tuple[SpecConfig, float | None] | None:
        """The setting for what follows the chunk `spec` just generated (plain decoding if it lost,
        another arm if one beat it by the margin, else `spec`) and that setting's predicted
        acceptance rate; None when the counterfactual cannot tell (sampled rows)."""
        got = while_speculating(self.engine, part, result, spec, self.arms, self.worker, self.batch_size, self.margin,
                                self.ratio, **self._how())
        self.running = self.predicted = None
        if got is None:
            return None
        new, arm = got
        self.predicted = arm.predicted_speedup if arm is not None else None
        if new == spec and arm is not None:
            self.running = arm.predicted_speedup
        return new, arm.acceptance_rate if arm is not None else None


@dataclass
class Drift:
    """Where a shard changed its setting while running (rows counted in the order the shard
    generated them), and the rule that changes it after each chunk."""

    fallback_row: int | None = None  # speculating -> "none"
    switch_row: int | None = None  # "none" or another arm -> switch_arm
    switch_arm: str | None = None
    switch_predicted: float | None = None  # switch_arm's predicted speedup over plain decoding where it switched

    def after_chunk(self, row: int, spec: SpecConfig, calibrated: float | None, part: Sequence[Request],
                    result: GenerateResult, watch, drift_ratio: float) -> tuple[SpecConfig, float | None]:
        """The setting for the rows from `row` on, after `spec` generated `part` (`result`), and its
        yardstick acceptance rate. Speculating: `watch.speculating` (the chunk's own counterfactual)
        or, where that cannot tell, acceptance below `drift_ratio` x `calibrated` sends the rows to
        plain decoding. Under "none": `watch` (counterfactual acceptance) may switch an arm on."""
        if spec is not NO_SPEC:
            got = watch.speculating(part, result, spec) if hasattr(watch, "speculating") else None
            if got is None:  # the counterfactual cannot tell: acceptance against calibration's
                rate = result.acceptance_rate
                loses = calibrated is not None and rate is not None and rate < drift_ratio * calibrated
                got = (NO_SPEC, None) if loses else (spec, calibrated)
        elif watch is not None:
            arm, predicted = watch(part, result)
            got = (arm, predicted) if arm is not None else (spec, calibrated)
        else:
            return spec, calibrated
        self.record(row, spec, got[0], getattr(watch, "predicted", None))
        return got

    def record(self, row: int, old: SpecConfig, new: SpecConfig, predicted: float | None = None) -> None:
        """The first row of each kind of change (and a switch's `predicted` speedup)."""
        if new is NO_SPEC and old is not NO_SPEC:
            self.fallback_row = row if self.fallback_row is None else self.fallback_row
        elif new != old and self.switch_row is None:
            self.switch_row, self.switch_arm, self.switch_predicted = row, new.label, predicted
