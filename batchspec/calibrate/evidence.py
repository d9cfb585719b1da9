"""What a shard's rows say about every arm (docs/calibration.md, concepts 2 and 3): the window the
calibration rule judges on, and the shard's own tallies.

Every finished row gives every arm's counterfactual acceptance (counterfactual.py): its tallies
join the window (the last `window` rows, estimate.Window) and the shard's totals, with the arm
the row finished under. While fewer than a batch of rows have finished, the rows in flight count
too, with their output so far, every CHECK_EVERY steps (not kept), so the first decision comes a
few steps into a shard, not after its first rows finish.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from batchspec.calibrate.counterfactual import end_step, measured_tallies, tallies
from batchspec.calibrate.estimate import RowTallies, Tally, Window
from batchspec.engine.acceptance import PlainRow
from batchspec.engine.base import Engine, Progress, Request, SpecConfig

# Each constant's reason is in docs/calibration.md, "Constants".
CHECK_EVERY = 8  # steps between the rule's checks on rows in flight, before a batch of rows has finished
ROW_TOKENS = 64.0  # a row's decode tokens, assumed until the shard's first rows finish


@dataclass(frozen=True)
class Judged:
    """What the rule judges on at one call: rows' tallies, and where rows in flight joined the
    window, what they are worth in finished rows (`estimates`' effective_rows)."""

    rows: list[RowTallies]
    effective: float | None = None


class Evidence:
    """What the shard's rows say about every arm (docs/calibration.md, concepts 2 and 3): each
    finished row's tallies join the window the rule judges on and the shard's totals; while fewer
    than a batch have finished, the rows in flight count too, with their output so far."""

    def __init__(self, engine: Engine, requests: Sequence[Request], arms: Sequence[SpecConfig], batch_size: int,
                 window: Window, tree) -> None:
        self.engine, self.requests, self.arms, self.batch_size = engine, requests, arms, batch_size
        self.window = window
        # a suffix arm's counterfactual tree: the key's on the worker at the start, the shard's rows
        # joining it as plain decoding would have finished them (the engine's own tree has them already)
        self.tree = tree
        self.totals: dict[str, Tally] = {"none": Tally()}  # this shard's counted rows, by arm label
        self.rows: dict[int, RowTallies] = {}  # this shard's counted rows' tallies, by request index
        self.specs: dict[int, SpecConfig] = {}  # the arm each finished row finished under, by request index
        self.exact = True  # every counted row's acceptance exact (greedy)
        self.counted = 0  # rows whose tallies were counted (greedy or sampled, not error rows)
        self.judged = False  # the rule has looked at the window (the key's history) once

    @property
    def finished(self) -> int:
        """Rows finished, error rows included."""
        return len(self.specs)

    @property
    def batch_rows(self) -> int:
        """A batch of the shard's rows: the batch, or every row of a shard smaller than one."""
        return min(self.batch_size, len(self.requests))

    @property
    def batch_counted(self) -> bool:
        """Whether a batch of the shard's rows has been counted (the first to finish are its short
        ones: before this, an arm the shard switches to is provisional, docs/calibration.md concept 7)."""
        return self.counted >= self.batch_rows

    @property
    def row_tokens(self) -> float:
        """A finished row's mean decode tokens (ROW_TOKENS before any)."""
        return self.totals["none"].tokens / self.counted if self.counted else ROW_TOKENS

    def count(self, progress: Progress) -> Judged | None:
        """Count the rows finished since the last call into the window. Returns what the rule
        should judge now: the window when rows finished; while fewer than a batch have, the window
        and the rows in flight with their output so far (every CHECK_EVERY steps; not kept); None
        when nothing new is known."""
        for i in progress.done:
            self.specs[i] = progress.spec
        done = [i for i in progress.done if progress.completions[i].finish_reason != "error"]
        if done:
            self._add(progress, done)
        if len(self.window) < self.batch_size and progress.in_flight and self.engine.counterfactual \
                and len(progress.steps) % CHECK_EVERY == 0:
            flying = [i for i, out in progress.in_flight.items() if len(out) > CHECK_EVERY]
            if flying:  # worth the finished rows their tokens make, at the mean length of a finished row
                partial = [self.plain(i, progress.in_flight[i]) for i in flying]
                effective = len(self.window) + sum(len(r.output_ids) for r in partial) / self.row_tokens
                return Judged(list(self.window) + tallies(self.engine, partial, self.arms, [self.requests[i] for i in flying],
                                                          self.tree, self.batch_size)[0], effective)
        if done or (not self.judged and self.window):
            self.judged = True
            return Judged(list(self.window))
        return None

    def _add(self, progress: Progress, done: list[int]) -> None:
        plain = [self.plain(i, progress.completions[i].token_ids) for i in done]
        rows, exact = tallies(self.engine, plain, self.arms, [self.requests[i] for i in done], self.tree,
                              self.batch_size, grow=True)
        if not self.engine.counterfactual:  # what tokens alone do not give, as the running arm measured it
            exact = exact and all(a.label in rows[0] for a in self.arms)  # every arm computed, none estimated
            ran = progress.spec.label
            for n, i in enumerate(done):
                measured = measured_tallies(progress.completions[i], progress.spec, self.arms, end_step(self.engine, plain[n]))
                rows[n] = {**measured, **rows[n], **({ran: measured[ran]} if ran in measured else {})}
        self.exact = self.exact and exact
        self.counted += len(rows)
        self.rows.update(zip(done, rows))
        for row in rows:
            self.window.add(row)
            for label, t in row.items():
                self.totals.setdefault(label, Tally())
                self.totals[label] += t

    def plain(self, index: int, output: Sequence[int]) -> PlainRow:
        request = self.requests[index]
        p = request.params
        return PlainRow(self.engine.encode(request), list(output), p.max_tokens, p.temperature, p.top_p)
