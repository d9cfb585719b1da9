"""What calibration decides and by which rule, written once for both ways of calibrating
(batchspec.calibrate.measured and .counterfactual): the pipeline file's `calibration:` settings,
the `Decision` record a shard runs with, the sample calibration decodes, and the choice.

The rule (docs/calibration.md): speculate only when

    (draft time + verify time + coordination time) / committed tokens  <  baseline time per token

by a margin (default 5%). Goodput is committed output tokens per second of decode time, at the
shard's production batch size. `choose` applies it to measured speedups, `choose_predicted` to
predicted ones: the same rule (`_choose`): the best speedup wins, the shorter draft among equals,
and speculation only when it `pays`, i.e. beats "none" by more than the margin.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Sequence

from batchspec.engine.base import NO_SPEC, Completion, Request, SpecConfig
from batchspec.stats import ArmResult, chosen_arm


@dataclass(frozen=True)
class CalibrationSettings:
    """The pipeline file's `calibration:` section. Each field declares its range in `metadata`
    (min / max inclusive, above exclusive); batchspec.config checks every key against the type
    and range at load, before any worker starts, so a new field needs only its declaration here."""

    sample_size: int = field(default=0, metadata={"min": 0})  # rows in the calibration sample; 0 = see sample_rows
    max_tokens: int = field(default=128, metadata={"min": 1})  # generation cap per row while calibrating: rows that fit are finished (and kept)
    rounds: int = field(default=2, metadata={"min": 1})  # interleaving rounds; the sample is split across them
    margin: float = field(default=0.05, metadata={"min": 0, "max": 1})  # speculation must beat "none" by this fraction
    max_fraction: float = field(default=0.10, metadata={"min": 0, "max": 1})  # calibration budget, as a fraction of the shard's expected time
    min_rows: int = field(default=16, metadata={"min": 0})  # smaller shards reuse the last decision of their shard key
    confirm: bool = True  # measure the predicted best draft length
    in_flight: bool = True  # calibrate inside the shard's own batch where the engine can switch in flight (calibrate.inflight)
    drift_ratio: float = field(default=0.5, metadata={"min": 0, "max": 1})  # fall back to "none" when acceptance drops below this x calibrated
    drift_chunk: int = field(default=0, metadata={"min": 0})  # rows per drift check; 0 = 8 x batch size
    drift_share: float = field(default=0.01, metadata={"above": 0, "max": 1})  # the most of a shard's decode time drift checks in flight may take; 1: no limit
    max_builds_per_worker: int = field(default=6, metadata={"min": 2})  # engines whose arms are builds (TensorRT-LLM): builds calibration may cause per worker (none and one arm at least)
    prediction_error: float = field(default=0.10, metadata={"min": 0})  # assumed error of a predicted speedup until confirmations measure it

    def sample_rows(self, batch_size: int, counterfactual: bool = False) -> int:
        """Rows in the sample, within [8, 64] unless set: twice the batch size where every arm is
        measured by running it on part of the sample; one batch where every arm is computed from
        the sample's plain run (counterfactual), whose decision the drift watch then re-checks on
        every chunk of the shard, so a larger sample would buy little and cost kept-but-slower rows."""
        return self.sample_size or min(64, max(8, batch_size if counterfactual else 2 * batch_size))


@dataclass
class Decision:
    """What a shard runs with, and the evidence."""

    chosen: SpecConfig
    arms: list[ArmResult] = field(default_factory=list)
    baseline_tokens_per_s: float | None = None
    calibration_s: float = 0.0
    overhead_s: float = 0.0  # calibration time whose work was not kept as output
    capped: bool = False
    source: str = "calibrated"  # calibrated | reused | fixed | too_small
    reason: str = ""
    shard_id: str | None = None  # the shard that was calibrated
    # Sample rows calibration generated to their end, by request id, with the arm that made each:
    # the shard keeps them instead of generating them again (calibration work is not thrown away).
    finished: dict[str, tuple[Completion, SpecConfig]] = field(default_factory=dict, repr=False)
    profile_s: float = 0.0  # seconds spent measuring the worker's cost profile for this shard
    confirmed: bool = False  # a paired measured run checked the prediction
    profile: list = field(default_factory=list, repr=False)  # the cost profile used (StepCost structs)

    @property
    def chosen_arm(self) -> ArmResult | None:
        return chosen_arm(self.arms, self.chosen)

    def reused_by(self, shard_id: str) -> "Decision":
        return replace(self, source="reused", calibration_s=0.0, overhead_s=0.0, capped=False, finished={},
                       profile_s=0.0, confirmed=False,
                       reason=f"shard too small to calibrate; reused the decision of {self.shard_id}")


def fixed_decision(spec: SpecConfig, reason: str) -> Decision:
    return Decision(spec, source="fixed", reason=reason)


def sample_indices(rows: int, n: int) -> list[int]:
    """n evenly spaced indices of `rows` (all of them when there are no more than n)."""
    if rows <= n:
        return list(range(rows))
    step = rows / n
    return [int(i * step) for i in range(n)]


def pick_sample(requests: Sequence[Request], n: int, max_tokens: int) -> list[Request]:
    """Evenly spaced rows (deterministic), with generation capped at `max_tokens`."""
    picked = [requests[i] for i in sample_indices(len(requests), n)]
    return [replace(r, params=replace(r.params, max_tokens=min(r.params.max_tokens, max_tokens))) for r in picked]


def is_complete(c: Completion, max_tokens: int) -> bool:
    """Did calibration generate this row to the end it would have had in production?"""
    return c.finish_reason == "stop" or (c.finish_reason == "length" and c.output_tokens >= max_tokens)


# -- the choice -------------------------------------------------------------------------------------


def pays(speedup: float, margin: float) -> bool:
    """The margin rule: speculation only when it beats plain decoding by more than `margin`."""
    return speedup > 1 + margin


def best(scored: Iterable[tuple[ArmResult, float]]) -> tuple[ArmResult, float] | None:
    """The (arm, speedup) with the highest speedup; among equal speedups the shorter draft (less
    draft work, less memory). None when nothing was scored."""
    return max(scored, key=lambda s: (s[1], -s[0].draft_len), default=None)


def choose(results: Sequence[ArmResult], arms: Sequence[SpecConfig], margin: float) -> tuple[SpecConfig, str]:
    """The rule over measured arms. An arm's speedup is its paired figure (same rows as "none",
    back to back) when calibration recorded one, else its goodput over the baseline's. Arms with
    errors or no measurement never win."""
    baseline = next((a for a in results if a.method == "none" and a.measured and a.tokens_per_s), None)
    if baseline is None:
        return NO_SPEC, "plain decoding could not be measured"
    usable = [a for a in results if a.measured and not a.error and a.tokens_per_s and a.method != "none"]
    return _choose([(a, a.vs_none(baseline.tokens_per_s)) for a in usable], arms, margin, "measured")


def predicted_speedups(results: Iterable[ArmResult]) -> list[tuple[ArmResult, float]]:
    """(arm, predicted speedup) of every speculative arm that has a prediction."""
    return [(a, a.predicted_speedup) for a in results if a.method != "none" and a.predicted_speedup]


def choose_predicted(results: Sequence[ArmResult], arms: Sequence[SpecConfig], margin: float) -> tuple[SpecConfig, str]:
    """The rule over predicted speedups."""
    return _choose(predicted_speedups(results), arms, margin, "predicted")


def takes_over(speedup: float, running: float, margin: float) -> bool:
    """Whether an arm predicted at `speedup` replaces the running arm, predicted at `running` on
    the same rows: only where it is faster by the margin, as speculation replaces plain decoding
    only where it beats it by the margin. The drift watch's rule for a running arm
    (calibrate.drift.while_speculating), and the decision's where a key's later shard decoded its
    sample under the key's last arm (`stays`)."""
    return speedup > running * (1 + margin)


def stays(results: Sequence[ArmResult], running: SpecConfig, chosen: SpecConfig,
          margin: float) -> tuple[ArmResult, float] | None:
    """The running arm and its predicted speedup where it stays: the rule chose another arm
    (`chosen`) that does not `takes_over` from it, and the running arm still pays. None where the
    choice stands: a sample's few rows do not rank two paying arms closer than the margin."""
    if running.method == "none" or chosen.method == "none" or chosen.label == running.label:
        return None
    scored = dict((a.label, (a, s)) for a, s in predicted_speedups(results))
    if running.label not in scored or chosen.label not in scored:
        return None
    mine, theirs = scored[running.label], scored[chosen.label][1]
    return mine if pays(mine[1], margin) and not takes_over(theirs, mine[1], margin) else None


def _choose(scored: Sequence[tuple[ArmResult, float]], arms: Sequence[SpecConfig], margin: float,
            how: str) -> tuple[SpecConfig, str]:
    """The best arm's setting if it pays, else "none"; and why, saying whether speedups were
    `how` = measured or predicted."""
    top = best(scored)
    if top is None:
        return NO_SPEC, f"no speculative arm could be {how}"
    arm, speedup = top
    if pays(speedup, margin):
        return next(s for s in arms if s.label == arm.label), f"{arm.label} {how} {speedup:.2f}x plain decoding"
    return NO_SPEC, f"best arm {arm.label} {how} {speedup:.2f}x plain decoding, not above the {margin:.0%} margin"


def speculation_unmeasured(decision: Decision) -> str | None:
    """Why no speculative arm could be measured in a calibration that tried some (None when one
    was measured, or none was tried): the run must say so loudly, not look like "none paid"."""
    tried = [a for a in decision.arms if a.method != "none"]
    if decision.source != "calibrated" or not tried or any((a.measured or a.predicted_speedup) and not a.error for a in tried):
        return None
    return "; ".join(f"{a.label}: {a.error or 'not measured'}" for a in tried)[:500]
