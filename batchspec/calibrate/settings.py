"""The pipeline file's `calibration:` section, and the record of what a shard decided."""

from __future__ import annotations

from dataclasses import dataclass, field

from batchspec.engine.base import NO_SPEC, SpecConfig
from batchspec.stats import ArmResult, Event


@dataclass(frozen=True)
class CalibrationSettings:
    """The `calibration:` section. Each field declares its range and description in `metadata`
    (min / max inclusive, above exclusive); batchspec.config checks every key against the type and
    range at load, before any worker starts, so a new field needs only its declaration here."""

    margin: float = field(default=0.05, metadata={"min": 0, "max": 1, "description": (
        "An arm must beat the running one by this fraction (another draft length of the running arm's drafter, "
        "where the shard has not chosen that arm on a batch of its own finished rows: by none).")})
    window: int = field(default=0, metadata={"min": 0, "description": "Finished rows the rule judges on; 0: max(16, 4 x batch size)."})
    measure_steps: int = field(default=16, metadata={"min": 1, "description": "Decode steps an arm runs to measure its price."})
    max_fraction: float = field(default=0.10, metadata={"min": 0, "max": 1, "description": "The most of a shard's decode measuring may take."})
    max_builds_per_worker: int = field(default=6, metadata={"min": 2, "description": "Engine builds measurements may cause per worker (TensorRT-LLM)."})

    def window_rows(self, batch_size: int) -> int:
        return self.window or max(16, 4 * batch_size)


@dataclass
class Decision:
    """What a shard ran with and why: the arm most of its rows finished under (`chosen`), every
    arm's estimate over the shard's rows (`arms`), the events, and what calibration cost."""

    chosen: SpecConfig = NO_SPEC
    ended: SpecConfig = NO_SPEC  # where the key's next shard starts: the arm before the drain, or the rule's choice at the end
    arms: list[ArmResult] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    source: str = "calibrated"  # calibrated | fixed
    reason: str = ""
    shard_id: str | None = None
    predicted_speedup: float | None = None  # the chosen arm's, over the shard's rows
    speedup: float | None = None  # the shard's goodput over plain decoding's price for its tokens
    baseline_tokens_per_s: float | None = None  # that plain price as a goodput
    calibration_s: float = 0.0  # the controller's own time (the worker's cost profile is not the shard's)
    profile_s: float = 0.0  # the worker's cost profile, where the worker timed it while this shard ran
    exact: bool = True  # every row's counterfactual acceptance exact (greedy)


def fixed_decision(spec: SpecConfig, reason: str) -> Decision:
    return Decision(spec, spec, source="fixed", reason=reason)
