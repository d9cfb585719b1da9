"""The simulated clock: a cost regime's prices handed to the torch engine as its clock.

The engine's decode loop names what it runs (engine/torch/clock.py); where the wall clock
measures each part, this clock ignores the wall and prices what ran by its shape: a prefill by its
prompts' lengths, a decode step by its rows, width and context (padded to the arm's draft where
the regime pads drafts, as TensorRT-LLM's CUDA graphs do, and reported so), a switch of arm by
the regime's build. Every second of a call is then the regime's: deterministic, whatever the
machine's load, and never a measurement.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from batchspec.engine.base import SpecConfig, Step, Timing
from batchspec.engine.torch.clock import Stepping
from batchspec.sim.regimes import Regime


@dataclass
class RegimeClock:
    """One generate call's clock on `regime` (engine/torch/clock.Clock)."""

    regime: Regime
    timing: Timing = field(default_factory=Timing)
    steps: list[Step] = field(default_factory=list)

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        yield  # a part's wall seconds are not the regime's: the step's shape is priced whole

    @contextmanager
    def prefill(self, prompt_lens: Sequence[int]) -> Iterator[None]:
        yield
        self.timing.prefill_s += sum(self.regime.prefill_s(n) for n in prompt_lens)

    @contextmanager
    def step(self, spec: SpecConfig) -> Iterator[Stepping]:
        stepping = Stepping()
        yield stepping
        ran = stepping.step
        tokens = 1 + spec.draft_len if self.regime.pads_drafts and spec.method != "none" else ran.tokens
        cost = self.regime.step(ran.rows, tokens, ran.context, spec.method)
        self.timing.draft_s += cost.draft_s
        self.timing.verify_s += cost.verify_s
        self.timing.other_s += cost.other_s
        self.steps.append(replace(ran, tokens=tokens, seconds=cost.total))

    @contextmanager
    def switch(self, spec: SpecConfig) -> Iterator[None]:
        yield
        self.timing.draft_s += self.regime.switch_s(spec.method)

    def close(self) -> Timing:
        self.timing.wall_s = self.timing.prefill_s + self.timing.decode_s
        return self.timing
