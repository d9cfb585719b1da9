"""The calibration controller: one rule, applied after every decode step of a shard.

A shard is one generate call. The controller (engine.base.Control) starts it under the key's last
arm (else plain decoding), and after each step:

    learn     every step the engine ran goes into the worker's cost table (predict/costs.py);
              on the worker's first shard at a batch size a short profile seeds it
    count     every finished row gives every arm's counterfactual acceptance (counterfactual.py),
              kept for the last `window` rows; while fewer than a batch have finished, the rows in
              flight count with their output so far
    decide    every arm's gain over the running arm R, with its uncertainty (estimate.py):
                switch   to the best arm where its lower bound beats R by the margin
                         (and, where a switch is a build, its gain over the rows left repays it)
                measure  run the best arm for `measure_steps` steps where its interval straddles
                         the margin, its price is what is uncertain (not its acceptance), it was
                         not measured in this shard, and the rows left repay the measurement
                stay     otherwise
The same rule on the same sliding window catches drift both ways. Each change is an `Event`.
`close` turns what happened into the shard's `Decision`.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

from batchspec.calibrate.counterfactual import end_step, measured_tallies, scope_of, tallies
from batchspec.calibrate.estimate import Estimate, Tally, Window, estimates, shard_speedups
from batchspec.calibrate.ledger import Ledger
from batchspec.calibrate.settings import CalibrationSettings, Decision
from batchspec.calibrate.worker import LAST_SHARD, WorkerState
from batchspec.engine.acceptance import PlainRow
from batchspec.engine.base import NO_SPEC, Engine, GenerateResult, Progress, Request, SpecConfig
from batchspec.stats import ArmResult, Event

CHECK_EVERY = 8  # steps between the rule's checks on rows in flight, before a batch of rows has finished
PAYBACK = 10  # a measurement runs only where the steps left are this many times its own
ROW_TOKENS = 64.0  # a row's decode tokens, assumed until the shard's first rows finish


class Controller:
    """The in-flight control of one shard's generate call (see the module docstring)."""

    def __init__(self, engine: Engine, requests: Sequence[Request], arms: Sequence[SpecConfig], batch_size: int,
                 settings: CalibrationSettings, worker: WorkerState, key: str | None = None,
                 prior: SpecConfig | None = None, switch_s: Callable[[SpecConfig], float] = lambda arm: 0.0,
                 horizon_rows: int = 0, prior_why: str = LAST_SHARD) -> None:
        self.engine, self.requests, self.batch_size, self.settings = engine, requests, batch_size, settings
        self.arms = [a for a in arms if a.method != "none"]
        self.worker, self.key, self.switch_s = worker, key, switch_s
        self.builds = switch_s(NO_SPEC) > 0  # an arm switch is a build (TensorRT-LLM): the live engine is where the key goes on
        self.start, why = worker.start(key, prior, self.arms, builds=self.builds, prior_why=prior_why)
        self.running = self.start
        self.steady = self.start  # the arm that last ran before the drain (rows queued or the batch full; not a trial)
        self.events: list[Event] = [Event(0, "start", self.start.label, None, None, why)]
        self.horizon_rows = horizon_rows  # rows of the key after this shard on this worker: what a build can repay over
        self.window = Window(settings.window_rows(batch_size), worker.history.get(str(key), ()))
        self.judged = False  # the rule has looked at the window (the key's history) once
        # a suffix arm's counterfactual tree: the key's on the worker at the start, the shard's rows
        # joining it as plain decoding would have finished them (the engine's own tree has them already)
        self.tree = None
        if any(a.method == "suffix" for a in self.arms):
            self.tree = engine.trees.copy_of(scope_of(key))
        self.totals = {"none": Tally()}  # this shard's rows, by arm label
        self.shard_rows: dict[int, dict] = {}  # this shard's rows' tallies, by request index
        self.row_specs: dict[int, SpecConfig] = {}
        self.ledger = Ledger(engine, worker.costs, batch_size, self.arms)  # the steps each arm ran, and their price
        self.exact = True
        self.finished = 0  # rows finished, error rows included
        self.counted = 0  # rows whose tallies were counted (greedy or sampled, not error rows)
        self.measuring: tuple[str, int, SpecConfig] | None = None  # (arm label, steps it ran, the arm before it)
        self.measured: set[str] = set()
        self.errors: dict[str, str] = {}  # arm label -> why it could not run
        self.measure_steps = 0
        self.control_s = 0.0
        self.effective: float | None = None  # what the rows the rule judges now are worth, where some are in flight

    # -- engine.base.Control ---------------------------------------------------------------------

    def __call__(self, progress: Progress) -> SpecConfig | None:
        began = time.perf_counter()
        self._learn(progress)
        new = self._decide(progress, self._count(progress))
        self.control_s += time.perf_counter() - began
        changed = new is not None and new.label != self.running.label
        if changed:
            self.running = new
        if not self.measuring and (progress.queued or len(progress.in_flight) >= self.batch_size):  # not a drain
            self.steady = self.running
        return new if changed else None

    def _learn(self, progress: Progress) -> None:
        new, profiled = self.ledger.learn(progress.steps, progress.spec)
        if profiled is not None:
            self.control_s -= profiled.wall_s  # counted as profile, not as the controller's own time
            self.events.append(Event(self.finished, "profile", "none", None, profiled.seconds,
                                     f"{profiled.points} forwards timed"))
        if self.measuring and self.measuring[0] == progress.spec.label:  # not the rows still draining before it
            label, n, before = self.measuring
            self.measuring = (label, n + new, before)
            self.measure_steps += new

    def _count(self, progress: Progress) -> list[dict[str, Tally]] | None:
        """Count the rows finished since the last call into the window. Returns the rows the rule
        should judge now: the window when rows finished; while fewer than a batch have, the window
        and the rows in flight with their output so far (every CHECK_EVERY steps; not kept); None
        when nothing new is known."""
        for i in progress.done:
            self.row_specs[i] = progress.spec
        self.finished += len(progress.done)
        done = [i for i in progress.done if progress.completions[i].finish_reason != "error"]
        if done:
            plain = [self._plain(i, progress.completions[i].token_ids) for i in done]
            rows, exact = tallies(self.engine, plain, self.arms, [self.requests[i] for i in done], self.tree,
                                  self.batch_size, grow=True)
        if done and not self.engine.counterfactual:  # what tokens alone do not give, as the running arm measured it
            exact = exact and all(a.label in rows[0] for a in self.arms)  # every arm computed, none estimated
            ran = progress.spec.label
            for n, i in enumerate(done):
                measured = measured_tallies(progress.completions[i], progress.spec, self.arms, end_step(self.engine, plain[n]))
                rows[n] = {**measured, **rows[n], **({ran: measured[ran]} if ran in measured else {})}
        if done:
            self.exact = self.exact and exact
            self.counted += len(rows)
            self.shard_rows.update(zip(done, rows))
            for row in rows:
                self.window.add(row)
                for label, t in row.items():
                    self.totals.setdefault(label, Tally())
                    self.totals[label] += t
        few = len(self.window) < self.batch_size
        self.effective = None
        if few and progress.in_flight and self.engine.counterfactual and len(progress.steps) % CHECK_EVERY == 0:
            flying = [i for i, out in progress.in_flight.items() if len(out) > CHECK_EVERY]
            if flying:  # worth the finished rows their tokens make, at the mean length of a finished row
                partial = [self._plain(i, progress.in_flight[i]) for i in flying]
                per_row = self.totals["none"].tokens / self.counted if self.counted else ROW_TOKENS
                self.effective = len(self.window) + sum(len(r.output_ids) for r in partial) / per_row
                return list(self.window) + tallies(self.engine, partial, self.arms, [self.requests[i] for i in flying],
                                                   self.tree, self.batch_size)[0]
        if done or (not self.judged and self.window):
            self.judged = True
            return list(self.window)
        return None

    def failed(self, arm: SpecConfig, reason: str) -> SpecConfig:
        """An arm could not run (its build failed): never again in this shard, and the shard goes
        back to the arm before it. Returns that arm."""
        before = self.measuring[2] if self.measuring else NO_SPEC
        self.measuring = None
        self.measured.add(arm.label)
        self.errors[arm.label] = reason
        self.events.append(Event(self.finished, "failed", arm.label, None, None, reason[:200]))
        self.running = before
        return before

    def _plain(self, index: int, output: Sequence[int]) -> PlainRow:
        request = self.requests[index]
        p = request.params
        return PlainRow(self.engine.encode(request), list(output), p.max_tokens, p.temperature, p.top_p)

    # -- the rule -------------------------------------------------------------------------------

    def _decide(self, progress: Progress, window: list | None) -> SpecConfig | None:
        left = bool(progress.in_flight or progress.queued)
        if self.measuring and (left or self.builds):
            return self._measured(progress, window)
        if self.measuring:  # the shard ended within a trial: the key's next shard does not start under it
            self.events.append(Event(self.finished, "measured", self.measuring[0], None, None, "cut by the shard's end"))
            self.measuring = None
        if not window or not (left or self.horizon_rows):  # nothing left to run under a choice
            return None
        # at the shard's end the rule chooses where the key's next shard starts, at the full batch: it
        # goes on from the arm that ran before the drain (`steady`), not from one the drain switched to
        running = self.running if left or self.builds else self.steady
        est = self._estimates(progress, window, running)
        best = max(est.values(), key=lambda e: (e.gain, -e.arm.draft_len))
        margin = 1 + self.settings.margin
        if best.arm.label != running.label:
            if best.low > margin and self._repays(progress, best.arm, 1 - 1 / best.low):
                if not left:
                    self.steady = best.arm  # where the key's next shard starts
                if best.arm.label == self.running.label:  # at the shard's end, the drain's arm
                    return None
                self.events.append(Event(self.finished, "switch", best.arm.label, best.speedup, None,
                                         f"{best.gain:.2f}x the running {running.label} (at least {best.low:.2f}x)"
                                         + ("" if left else "; for the key's next shard")))
                return best.arm
        if not left:  # the key's next shard starts under `steady` (close)
            return None
        if best.arm.label != running.label:
            if best.high > margin and best.cost_u > best.accept_u and best.arm.label not in self.measured \
                    and self._affords_measure(progress, best.arm, best.expected_saving):
                return self._measure(best.arm, best.speedup, f"{best.low:.2f}x-{best.high:.2f}x the running "
                                     f"{self.running.label}: its price is unsure")
        unknown = self._unknown(est) if left else None
        if unknown is not None and self._affords_measure(progress, unknown, 1 - 1 / margin):
            return self._measure(unknown, None, "its acceptance is measured by running it")
        return None

    def _measure(self, arm: SpecConfig, predicted: float | None, why: str) -> SpecConfig:
        self.measured.add(arm.label)
        if self.engine.arms_are_builds:
            self.worker.measure_builds += 1
        self.measuring = (arm.label, 0, self.running)
        self.events.append(Event(self.finished, "measure", arm.label, predicted, None, why))
        return arm

    def _measured(self, progress: Progress, window: list | None) -> SpecConfig | None:
        """A measurement is a trial: once its steps have run, the arm stays only where it beats the
        arm that ran before it by the margin at its lower bound (the rule, with its price now
        measured); else the shard goes back to that arm."""
        label, steps, before = self.measuring
        if steps < self.settings.measure_steps:
            return None
        self.measuring = None
        rows = list(self.window) or window or []
        trial = self._estimates(progress, rows, before).get(label) if rows else None
        margin = 1 + self.settings.margin
        keep = trial is not None and trial.low > margin
        if trial is not None and not keep and self.builds:  # going back is a build: the switch rule's
            back = 1 / trial.high  # the arm before over the trial, at its lower bound
            keep = not (back > margin and self._repays(progress, before, 1 - 1 / back))
        self.events.append(Event(self.finished, "measured", label, None, trial.speedup if trial else None,
                                 (f"{trial.gain:.2f}x {before.label} (at least {trial.low:.2f}x): " if trial else "")
                                 + ("kept" if keep else f"back to {before.label}")))
        return None if keep else before

    def _unknown(self, est: dict[str, Estimate]) -> SpecConfig | None:
        """An arm with no estimate (its acceptance cannot be computed and it has not run), the
        longest draft of a method first (its run prices the method's shorter drafts too), within
        the worker's build cap where arms are builds."""
        if self.engine.arms_are_builds and self.worker.measure_builds >= self.settings.max_builds_per_worker:
            return None
        todo = [a for a in self.arms if a.label not in est and a.label not in self.measured]
        return max(todo, key=lambda a: (a.draft_len, a.label)) if todo else None

    def _estimates(self, progress: Progress, window: list, running: SpecConfig) -> dict[str, Estimate]:
        """At the rows in flight; at the shard's end, at the batch the key's next shard runs at."""
        rows = min(self.batch_size, len(progress.in_flight) + progress.queued) or self.batch_size
        context = progress.steps[-1].context if progress.steps else 0
        return estimates(window, self.arms, running, self.worker.costs, rows, context, self.effective)

    def _steps_left(self, progress: Progress) -> float:
        """Decode steps the shard has left under the running arm: its rows left at the mean length
        of the rows counted so far (64 tokens before any), at the running arm's accepted length."""
        per_row = self.totals["none"].tokens / self.counted if self.counted else ROW_TOKENS
        left_tokens = max(0.0, (len(progress.in_flight) + progress.queued + self.horizon_rows) * per_row
                          - sum(len(o) for o in progress.in_flight.values()))
        rows = max(1, min(self.batch_size, len(progress.in_flight) + progress.queued + self.horizon_rows))
        running = self.totals.get(self.running.label)
        return left_tokens / (running.accepted_len if running else 1.0) / rows

    def _repays(self, progress: Progress, arm: SpecConfig, saving: float) -> bool:
        """Whether switching to `arm` pays back its cost (a build) over the steps left, where it
        saves `saving` of their time: a switch's at its lower bound, 1 - 1/low; a measurement's,
        the expected saving (`Estimate.expected_saving`; an unknown arm's at the margin)."""
        cost = self.switch_s(arm)
        if cost <= 0:
            return True
        steps = progress.steps[-8:]
        step_s = sum(s.seconds for s in steps) / len(steps) if steps else 0.0
        return saving > 0 and self._steps_left(progress) * step_s * saving > cost

    def _affords_measure(self, progress: Progress, arm: SpecConfig, saving: float) -> bool:
        """A measurement's steps are at most max_fraction of the shard's and 1/PAYBACK of those
        left, and its switch (a build) is repaid by its expected saving over the steps left."""
        m = self.settings.measure_steps
        left = self._steps_left(progress)
        within = self.measure_steps + m <= self.settings.max_fraction * (left + len(progress.steps))
        return left >= PAYBACK * m and within and self._repays(progress, arm, saving)

    # -- the record ------------------------------------------------------------------------------

    def close(self, result: GenerateResult, shard_id: str | None = None) -> tuple[Decision, list[SpecConfig]]:
        """The shard's Decision, and the arm each row finished under (request order)."""
        specs = [self.row_specs.get(i, self.running) for i in range(len(self.requests))]
        counts: dict[str, int] = {}
        for s in specs:
            counts[s.label] = counts.get(s.label, 0) + 1
        by_label = {"none": NO_SPEC, **{a.label: a for a in self.arms}}
        chosen = by_label.get(max(counts, key=counts.get), self.running) if counts else self.running
        ended = self.running if self.builds else self.steady  # not a drain's arm, nor a trial's
        self.worker.remember(self.key, ended, list(self.window))
        costs = self.worker.costs
        context = result.steps[len(result.steps) // 2].context if result.steps else 0
        # every arm over this shard's rows where they have its tally, else over the window (an arm
        # measured on the key's earlier rows, where acceptance is measured by running)
        whole = {**estimates(list(self.window), self.arms, NO_SPEC, costs, self.batch_size, context),
                 **(estimates([self.totals], self.arms, NO_SPEC, costs, self.batch_size, context) if self.totals["none"].steps else {})}
        drained = shard_speedups([self.shard_rows[i] for i in sorted(self.shard_rows)], self.arms, costs,
                                 self.batch_size, context)
        speedup = {label: drained.get(label, e.speedup) for label, e in whole.items()}
        arms = []
        for label, arm in by_label.items():
            e, ran, t = whole.get(label), self.ledger.ran.get(label), self.totals.get(label, Tally())
            arms.append(ArmResult(
                arm.method, arm.draft_len, measured=bool(ran and ran.steps),
                rows_run=counts.get(label, 0), tokens_run=ran.committed if ran else 0,
                tokens_per_s=ran.committed / ran.seconds if ran and ran.seconds else None,
                predicted_speedup=speedup[label] if e else None,
                acceptance_rate=e.acceptance_rate if e else None, mean_accepted_len=e.accepted_len if e else None,
                acceptance_exact=self.exact, tally_rows=sum(label in row for row in self.shard_rows.values()),
                tally_target_steps=int(t.steps), tally_draft_tokens=int(t.drafted), tally_accepted_tokens=int(t.accepted),
                error=self.errors.get(label),
            ))
        speedup_run, baseline = self.ledger.plain()
        switched = [e for e in self.events if e.kind == "switch"]
        reason = (f"started under {self.start.label} ({self.events[0].reason}); "
                  + (f"{len(switched)} switch(es), last to {switched[-1].arm}" if switched else "no switch"))
        decision = Decision(
            chosen=chosen, ended=ended, arms=arms, events=list(self.events), reason=reason, shard_id=shard_id,
            predicted_speedup=speedup.get(chosen.label),
            speedup=speedup_run, baseline_tokens_per_s=baseline,
            calibration_s=self.ledger.profile_s + self.control_s, profile_s=self.ledger.profile_s,
            exact=self.exact,
        )
        return decision, specs
