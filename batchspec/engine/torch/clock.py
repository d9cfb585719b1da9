"""Where a generate call's seconds come from: one clock per call, made by the clock the engine was
given (`TorchEngine(clock=...)`, the wall clock unless a caller injects another).

The decode loop (decode.py) names what it runs, around the calls that run it: a prefill of rows, a
part of a step (proposing: `draft_s`; the verify forward: `verify_s`; the accept rule and the
loop's bookkeeping: `other_s`), a whole step with its shape, a switch of drafter. `WallClock`
measures each on the wall clock. A clock may instead price each by its shape (a simulator's,
from its own package); the loop and the engine never know which they have.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import ContextManager, Protocol

from batchspec.engine.base import SpecConfig, Step, Timing


@dataclass
class Stepping:
    """A step being timed (`Clock.step`): the loop sets `step`, the step as it ran without its
    seconds; the clock adds them when the step ends."""

    step: Step | None = None


class Clock(Protocol):
    """One generate call's clock: its `timing` so far and every decode step it timed, in order."""

    timing: Timing
    steps: list[Step]

    def part(self, name: str) -> ContextManager[None]:
        """The block is part `name` of a step or an admission (a `Timing` field: draft_s, verify_s, other_s, prefill_s)."""

    def prefill(self, prompt_lens: Sequence[int]) -> ContextManager[None]:
        """The block prefills rows of these prompt lengths."""

    def step(self, spec: SpecConfig) -> ContextManager[Stepping]:
        """The block is one decode step under `spec`; when it ends, the step with its seconds joins `steps`."""

    def switch(self, spec: SpecConfig) -> ContextManager[None]:
        """The block switches the rows in flight to `spec`'s drafter."""

    def close(self) -> Timing:
        """The call's timing, its `wall_s` set."""


@dataclass
class WallClock:
    """The real clock: every part measured on the wall clock (`time.perf_counter`)."""

    timing: Timing = field(default_factory=Timing)
    steps: list[Step] = field(default_factory=list)
    began: float = field(default_factory=time.perf_counter)

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        yield
        setattr(self.timing, name, getattr(self.timing, name) + time.perf_counter() - began)

    def prefill(self, prompt_lens: Sequence[int]) -> ContextManager[None]:
        return self.part("prefill_s")

    @contextmanager
    def step(self, spec: SpecConfig) -> Iterator[Stepping]:
        began, stepping = time.perf_counter(), Stepping()
        yield stepping
        self.steps.append(replace(stepping.step, seconds=time.perf_counter() - began))

    def switch(self, spec: SpecConfig) -> ContextManager[None]:
        return self.part("draft_s")

    def close(self) -> Timing:
        self.timing.wall_s = time.perf_counter() - self.began
        return self.timing
