"""The calibration controller: one rule, applied after every decode step of a shard.

A shard is one generate call. The controller (engine.base.Control) starts it under the key's last
arm (else plain decoding), and after each step:

    learn     every step the engine ran goes into the worker's cost table (`Ledger`);
              on the worker's first shard at a batch size a short profile seeds it
    count     every finished row gives every arm's counterfactual acceptance (evidence.py),
              kept for the last `window` rows; while fewer than a batch have finished, the rows in
              flight count with their output so far
    decide    `rule`: every arm's gain over the running arm R, with its uncertainty (estimate.py):
                switch   to the best arm where its lower bound beats R by the margin (none to
                         another length of R's drafter while R is provisional: `Moment.margin`)
                         (and, where a switch is a build, its gain over the rows left repays it)
                measure  run the best arm for `measure_steps` steps (a `Trial`) where its interval
                         straddles the margin, its price is what is uncertain (not its acceptance),
                         it was not measured in this shard, and the rows left repay the measurement
                stay     otherwise
              a trial whose steps have run stays only where it beats the arm before it
The same rule on the same sliding window catches drift both ways. Each change is an `Event`.

One owner each: `Evidence` holds what the rows say (the window), the `Ledger` what the steps
cost, `Course` the arms the shard runs (the trial in progress among them), the controller the
events; `rule` is a function of an estimate per arm and a `Moment`: change the rule there. Whether
an arm switch is a build is the engine's to say (`Engine.arms_are_builds`), and no one else's.
`close` turns what happened into the shard's `Decision`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from batchspec.calibrate.counterfactual import scope_of
from batchspec.calibrate.estimate import Estimate, Tally, Window, estimates, shard_speedups
from batchspec.calibrate.evidence import Evidence, Judged
from batchspec.calibrate.ledger import Ledger
from batchspec.calibrate.settings import CalibrationSettings, Decision
from batchspec.calibrate.worker import LAST_SHARD, WorkerState
from batchspec.engine.base import NO_SPEC, Engine, GenerateResult, Progress, Request, SpecConfig
from batchspec.stats import ArmResult, Event

# Each constant's reason is in docs/calibration.md, "Constants".
PAYBACK = 10  # a measurement runs only where the steps left are this many times its own
SHORT_TRIAL = 4  # a trial cut to the steps left (a short shard's) runs at least this many steps
RECENT_STEPS = 8  # the last steps whose mean seconds price a step left, where a switch's build is weighed
REASON_CHARS = 200  # an event's reason is one short line: a failed build's is cut there
DRAIN_SHARE = 0.5  # no measurement once no row is queued and fewer than this share of a batch is in flight


@dataclass(frozen=True)
class Choice:
    """What the rule decided: `kind` stay | switch | measure | measured (a trial judged), the arm
    to go on under (None: stay), the speedup the rule predicted or measured, and why."""

    kind: str
    arm: SpecConfig | None = None
    predicted: float | None = None
    measured: float | None = None
    why: str = ""
    steps: int = 0  # a measurement's steps (Moment.trial_len)


STAY = Choice("stay")


@dataclass
class Trial:
    """An arm measured by running it: it runs `due` decode steps (`Moment.trial_len`), then the
    rule judges it against `before`, the arm it replaced."""

    arm: SpecConfig
    before: SpecConfig
    due: int
    steps: int = 0  # decode steps it has run


@dataclass(frozen=True)
class Moment:
    """What the rule weighs besides each arm's estimate, at one call of the controller."""

    running: SpecConfig  # R, the arm the estimates are against (at the shard's end: the one before the drain)
    left: bool  # rows in flight or queued (else the shard's end: the rule decides where the key's next shard starts)
    filled: float  # rows in flight and queued over a batch: below DRAIN_SHARE a drain (the batch shrinks every step)
    trial: Trial | None  # a trial whose steps have run, judged against R, the arm before it
    untried: tuple[SpecConfig, ...]  # arms a measurement may run: not measured in this shard (none past the build cap)
    builds: bool  # an arm switch is a build (Engine.arms_are_builds)
    settings: CalibrationSettings
    switch_s: Callable[[SpecConfig], float]  # what switching to an arm costs (Engine.switch_s)
    steps_left: float  # decode steps the shard, and the key's rows to come, have left under the running arm
    steps_run: int  # decode steps the shard has run
    trial_steps: int  # of them, its trials'
    step_s: float  # a step's seconds: the mean of the last RECENT_STEPS
    provisional: bool = False  # R is not yet the shard's choice (Course.provisional), and a batch of its rows finished (concept 7)

    def margin(self, arm: SpecConfig) -> float:
        """What `arm` must beat R by at its lower bound: 1 + the settings' margin, or 1 for another
        draft length of a provisional R's own drafter (docs/calibration.md, concept 7)."""
        same = arm.method == self.running.method != "none" and arm.draft_model == self.running.draft_model
        return 1.0 if self.provisional and same else 1 + self.settings.margin

    def repays(self, arm: SpecConfig, saving: float) -> bool:
        """Whether switching to `arm` pays back its cost (a build) over the steps left, where it
        saves `saving` of their time: a switch's at its lower bound, 1 - 1/low; a measurement's,
        the expected saving (`Estimate.expected_saving`; an unknown arm's at the margin)."""
        cost = self.switch_s(arm)
        if cost <= 0:
            return True
        return saving > 0 and self.steps_left * self.step_s * saving > cost

    @property
    def trial_len(self) -> int:
        """A measurement's steps: `measure_steps`, or 1/PAYBACK of the steps left where fewer (a
        short shard learns a price from a shorter trial rather than never)."""
        return min(self.settings.measure_steps, int(self.steps_left // PAYBACK))

    def affords(self, arm: SpecConfig, saving: float) -> bool:
        """A measurement's steps are at most max_fraction of the shard's and 1/PAYBACK of those left,
        and its switch (a build) is repaid by its expected saving over the steps left; a trial cut
        short (at least SHORT_TRIAL steps) runs only while the batch is full, where what it learns
        is the price of the rows queued."""
        m, full = self.trial_len, self.settings.measure_steps
        within = self.trial_steps + m <= self.settings.max_fraction * (self.steps_left + self.steps_run)
        short = m >= min(SHORT_TRIAL, full) and self.filled >= 1
        return (m >= full or short) and within and self.repays(arm, saving)


def rule(est: Mapping[str, Estimate], at: Moment) -> Choice:
    """The rule (docs/calibration.md, concept 7) on every arm's estimate against R = `at.running`,
    the best arm by gain (the shorter draft among equals): a trial whose steps have run stays only
    where it beats R by the margin at its lower bound, or where going back is a build the rows left
    do not repay; else switch to the best arm where its lower bound beats R by the margin and the
    rows left repay the switch (no margin to another draft length of a provisional R's drafter:
    `Moment.margin`); else, while rows are left and not draining (DRAIN_SHARE), measure the
    best arm where its price is what is unsure, or an arm with no estimate (the longest draft of a
    method first: its run estimates the shorter ones); else stay."""
    margin = 1 + at.settings.margin
    if at.trial is not None:
        trial = est.get(at.trial.arm.label)
        keep = trial is not None and trial.low > at.margin(trial.arm)
        if trial is not None and not keep and at.builds:  # going back is a build: the switch rule's
            back = 1 / trial.high  # the arm before over the trial, at its lower bound
            keep = not (back > margin and at.repays(at.running, 1 - 1 / back))
        why = (f"{trial.gain:.2f}x {at.running.label} (at least {trial.low:.2f}x): " if trial else "") \
            + ("kept" if keep else f"back to {at.running.label}")
        return Choice("measured", None if keep else at.running, measured=trial.speedup if trial else None, why=why)
    best = max(est.values(), key=lambda e: (e.gain, -e.arm.draft_len))
    other, to_best = best.arm.label != at.running.label, at.margin(best.arm)
    if other and best.low > to_best and at.repays(best.arm, 1 - 1 / best.low):
        return Choice("switch", best.arm, best.speedup, why=f"{best.gain:.2f}x the running {at.running.label} "
                      f"(at least {best.low:.2f}x)" + ("" if at.left else "; for the key's next shard")
                      + ("; it was not yet the shard's choice: no margin to another length" if to_best == 1 else ""))
    if not at.left or at.filled < DRAIN_SHARE:  # a measurement in a drain learns the price of a batch that is gone
        return STAY
    untried = {a.label for a in at.untried}
    if other and best.high > to_best and best.cost_u > best.accept_u and best.arm.label in untried \
            and at.affords(best.arm, best.expected_saving):
        return Choice("measure", best.arm, best.speedup, steps=at.trial_len,
                      why=f"{best.low:.2f}x-{best.high:.2f}x the running {at.running.label}: its price is unsure")
    unknown = max((a for a in at.untried if a.label not in est), key=lambda a: (a.draft_len, a.label), default=None)
    if unknown is not None and at.affords(unknown, 1 - 1 / margin):
        return Choice("measure", unknown, why="its acceptance is measured by running it", steps=at.trial_len)
    return STAY


@dataclass
class Course:
    """The arms a shard runs: the one it started under, the one running, the one that last ran
    before the drain (rows queued or the batch full, or every row of a shard smaller than a batch
    in flight; not a trial: where the key's next shard starts), the trial in progress, and the
    arms it measured or could not run."""

    start: SpecConfig
    running: SpecConfig
    steady: SpecConfig
    trial: Trial | None = None
    tried: set[str] = field(default_factory=set)  # arms measured in this shard (each once)
    trial_steps: int = 0  # decode steps the shard's trials ran
    failed: dict[str, str] = field(default_factory=dict)  # arm label -> why it could not run
    # the running arm is not yet the shard's own choice (Moment.provisional): another key's it started
    # under, or one it switched to before a batch of its rows had finished (on their first, short ones),
    # until a switch on a batch of finished rows or a trial it keeps
    provisional: bool = False


class Controller:
    """The in-flight control of one shard's generate call (see the module docstring)."""

    def __init__(self, engine: Engine, requests: Sequence[Request], arms: Sequence[SpecConfig], batch_size: int,
                 settings: CalibrationSettings, worker: WorkerState, key: str | None = None,
                 prior: SpecConfig | None = None, horizon_rows: int = 0, prior_why: str = LAST_SHARD) -> None:
        self.engine, self.batch_size, self.settings = engine, batch_size, settings
        self.arms = [a for a in arms if a.method != "none"]
        self.worker, self.key = worker, key
        self.horizon_rows = horizon_rows  # rows of the key after this shard on this worker: what a build can repay over
        start, why, own = worker.start(key, prior, self.arms, builds=self.builds, prior_why=prior_why,
                                       rows=max(1, min(batch_size, len(requests))))
        self.course = Course(start, start, start, provisional=not own)
        self.events: list[Event] = [Event(0, "start", start.label, None, None, why)]
        tree = engine.trees.copy_of(scope_of(key)) if any(a.method == "suffix" for a in self.arms) else None
        window = Window(settings.window_rows(batch_size), worker.history.get(str(key), ()))
        self.evidence = Evidence(engine, requests, self.arms, batch_size, window, tree)
        self.ledger = Ledger(engine, worker.costs, batch_size, self.arms)  # the steps each arm ran, and their price
        self.control_s = 0.0  # the controller's own seconds (a profile's left out)

    @property
    def builds(self) -> bool:
        """Whether an arm switch is a build (TensorRT-LLM): the live engine is where the key goes on."""
        return self.engine.arms_are_builds

    @property
    def start(self) -> SpecConfig:
        return self.course.start

    @property
    def running(self) -> SpecConfig:
        return self.course.running

    # -- engine.base.Control ---------------------------------------------------------------------

    def __call__(self, progress: Progress) -> SpecConfig | None:
        began = time.perf_counter()
        self._learn(progress)
        new = self._apply(self._decide(progress, self.evidence.count(progress)), progress)
        self.control_s += time.perf_counter() - began
        course = self.course
        changed = new is not None and new.label != course.running.label
        if changed:
            course.running = new
        full = self.evidence.batch_rows  # a shard of fewer rows than a batch fills it with them all
        if course.trial is None and (progress.queued or len(progress.in_flight) >= full):  # not a drain
            course.steady = course.running
        return new if changed else None

    def _learn(self, progress: Progress) -> None:
        new, profiled, retimed = self.ledger.learn(progress.steps, progress.spec)
        if profiled is not None:
            self.control_s -= profiled.wall_s  # the worker's, not the controller's own time
            self.worker.profile_s += profiled.seconds
            self.events.append(Event(self.evidence.finished, "profile", "none", None, profiled.seconds,
                                     f"the worker's cost profile: {profiled.points} forwards timed, once per worker "
                                     "and batch size (not this shard's)"))
        if retimed is not None and retimed.after != retimed.before:  # its seconds stay in control_s: this shard's
            self.events.append(Event(self.evidence.finished, "profile", "none", None, retimed.seconds,
                                     f"a profile forward re-timed: the machine runs at {retimed.after:.2f}x the profile's "
                                     f"seconds (was {retimed.before:.2f}x), every price scaled"))
        trial = self.course.trial
        if trial is not None and trial.arm.label == progress.spec.label:  # not the rows still draining before it
            trial.steps += new
            self.course.trial_steps += new

    def failed(self, arm: SpecConfig, reason: str) -> SpecConfig:
        """An arm could not run (its build failed): never again in this shard, and the shard goes
        back to the arm before it. Returns that arm."""
        course = self.course
        before = course.trial.before if course.trial else NO_SPEC
        course.trial = None
        course.tried.add(arm.label)
        course.failed[arm.label] = reason
        self.events.append(Event(self.evidence.finished, "failed", arm.label, None, None, reason[:REASON_CHARS]))
        course.running = before
        return before

    # -- the rule's questions and answers ---------------------------------------------------------

    def _decide(self, progress: Progress, judged: Judged | None) -> Choice:
        """Ask the rule what is due now: a trial's verdict once its steps have run; else, where
        something new is known and rows are left to run under a choice, the next arm."""
        course, left = self.course, bool(progress.in_flight or progress.queued)
        trial = course.trial
        if trial is not None and (left or self.builds):
            if trial.steps < trial.due:
                return STAY
            rows = list(self.evidence.window) or (judged.rows if judged else [])
            est = self._estimates(progress, rows, trial.before, judged) if rows else {}
            return rule(est, self._moment(progress, trial.before, left, trial))
        if trial is not None:  # the shard ended within a trial: the key's next shard does not start under it
            self.events.append(Event(self.evidence.finished, "measured", trial.arm.label, None, None, "cut by the shard's end"))
            course.trial = None
        if judged is None or not judged.rows or not (left or self.horizon_rows):  # nothing left to run under a choice
            return STAY
        # at the shard's end the rule chooses where the key's next shard starts, at the full batch: it
        # goes on from the arm that ran before the drain (`steady`), not from one the drain switched to
        running = course.running if left or self.builds else course.steady
        return rule(self._estimates(progress, judged.rows, running, judged), self._moment(progress, running, left))

    def _apply(self, choice: Choice, progress: Progress) -> SpecConfig | None:
        """Record the rule's choice (an event, a trial begun or ended); the arm to go on under."""
        course, row = self.course, self.evidence.finished
        if choice.kind == "switch":
            course.provisional = not self.evidence.batch_counted  # the shard's own choice once a batch has finished
            if not (progress.in_flight or progress.queued):
                course.steady = choice.arm  # where the key's next shard starts
                if choice.arm.label == course.running.label:  # at the shard's end, the drain's arm
                    return None
            self.events.append(Event(row, "switch", choice.arm.label, choice.predicted, None, choice.why))
        elif choice.kind == "measure":
            course.tried.add(choice.arm.label)
            if self.builds:
                self.worker.measure_builds += 1
            course.trial = Trial(choice.arm, course.running, choice.steps)
            self.events.append(Event(row, "measure", choice.arm.label, choice.predicted, None, choice.why))
        elif choice.kind == "measured":
            if choice.arm is None:  # a kept trial: measured by running it, the shard's own choice
                course.provisional = False
            self.events.append(Event(row, "measured", course.trial.arm.label, None, choice.measured, choice.why))
            course.trial = None
        return choice.arm

    def _estimates(self, progress: Progress, rows: list, running: SpecConfig, judged: Judged | None) -> dict[str, Estimate]:
        """At the rows in flight; at the shard's end, at the batch the key's next shard runs at."""
        batch = min(self.batch_size, len(progress.in_flight) + progress.queued) or self.batch_size
        context = progress.steps[-1].context if progress.steps else 0
        return estimates(rows, self.arms, running, self.worker.costs, batch, context, judged.effective if judged else None)

    def _moment(self, progress: Progress, running: SpecConfig, left: bool, trial: Trial | None = None) -> Moment:
        capped = self.builds and self.worker.measure_builds >= self.settings.max_builds_per_worker
        untried = () if capped else tuple(a for a in [NO_SPEC, *self.arms] if a.label not in self.course.tried)
        recent = progress.steps[-RECENT_STEPS:]
        filled = (len(progress.in_flight) + progress.queued) / self.batch_size
        return Moment(running, left, filled, trial, untried, self.builds, self.settings, self.engine.switch_s,
                      self._steps_left(progress), len(progress.steps), self.course.trial_steps,
                      sum(s.seconds for s in recent) / len(recent) if recent else 0.0,
                      self.course.provisional and self.evidence.batch_counted)

    def _steps_left(self, progress: Progress) -> float:
        """Decode steps the shard has left under the running arm: its rows left (and the key's rows
        to come) at the mean length of the rows counted so far, at the running arm's accepted length."""
        left_tokens = max(0.0, (len(progress.in_flight) + progress.queued + self.horizon_rows) * self.evidence.row_tokens
                          - sum(len(o) for o in progress.in_flight.values()))
        rows = max(1, min(self.batch_size, len(progress.in_flight) + progress.queued + self.horizon_rows))
        running = self.evidence.totals.get(self.course.running.label)
        return left_tokens / (running.accepted_len if running else 1.0) / rows

    # -- the record ------------------------------------------------------------------------------

    def close(self, result: GenerateResult, shard_id: str | None = None) -> tuple[Decision, list[SpecConfig]]:
        """The shard's Decision, and the arm each row finished under (request order)."""
        course, evidence = self.course, self.evidence
        specs = [evidence.specs.get(i, course.running) for i in range(len(evidence.requests))]
        counts: dict[str, int] = {}
        for s in specs:
            counts[s.label] = counts.get(s.label, 0) + 1
        by_label = {"none": NO_SPEC, **{a.label: a for a in self.arms}}
        chosen = by_label.get(max(counts, key=counts.get), course.running) if counts else course.running
        ended = course.running if self.builds else course.steady  # not a drain's arm, nor a trial's
        self.worker.remember(self.key, ended, list(evidence.window))
        costs = self.worker.costs
        context = result.steps[len(result.steps) // 2].context if result.steps else 0
        # every arm over this shard's rows where they have its tally, else over the window (an arm
        # measured on the key's earlier rows, where acceptance is measured by running)
        whole = {**estimates(list(evidence.window), self.arms, NO_SPEC, costs, self.batch_size, context),
                 **(estimates([evidence.totals], self.arms, NO_SPEC, costs, self.batch_size, context)
                    if evidence.totals["none"].steps else {})}
        drained = shard_speedups([evidence.rows[i] for i in sorted(evidence.rows)], self.arms, costs,
                                 self.batch_size, context)
        speedup = {label: drained.get(label, e.speedup) for label, e in whole.items()}
        arms = []
        for label, arm in by_label.items():
            e, ran, t = whole.get(label), self.ledger.ran.get(label), evidence.totals.get(label, Tally())
            arms.append(ArmResult(
                arm.method, arm.draft_len, measured=bool(ran and ran.steps),
                rows_run=counts.get(label, 0), tokens_run=ran.committed if ran else 0,
                tokens_per_s=ran.committed / ran.seconds if ran and ran.seconds else None,
                predicted_speedup=speedup[label] if e else None,
                acceptance_rate=e.acceptance_rate if e else None, mean_accepted_len=e.accepted_len if e else None,
                acceptance_exact=evidence.exact, tally_rows=sum(label in row for row in evidence.rows.values()),
                tally_target_steps=int(t.steps), tally_draft_tokens=int(t.drafted), tally_accepted_tokens=int(t.accepted),
                error=course.failed.get(label),
            ))
        speedup_run, baseline = self.ledger.plain()
        switched = [e for e in self.events if e.kind == "switch"]
        reason = (f"started under {course.start.label} ({self.events[0].reason}); "
                  + (f"{len(switched)} switch(es), last to {switched[-1].arm}" if switched else "no switch"))
        decision = Decision(
            chosen=chosen, ended=ended, arms=arms, events=list(self.events), reason=reason, shard_id=shard_id,
            predicted_speedup=speedup.get(chosen.label),
            speedup=speedup_run, baseline_tokens_per_s=baseline,
            calibration_s=self.control_s, profile_s=self.ledger.profile_s,
            exact=evidence.exact,
        )
        return decision, specs
